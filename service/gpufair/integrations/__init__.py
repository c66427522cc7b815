"""Bridges between gpufair and batch systems; each uses only gpufair's gRPC client."""
