"""Generated from proto/gpufair/v1; do not edit."""
