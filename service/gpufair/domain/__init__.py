"""Pure scheduling logic: no database, clock or network. Server and simulator share it."""
