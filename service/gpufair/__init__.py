"""gpufair: time-aware fair-share scheduling for shared, heterogeneous GPU clusters."""

__version__ = "0.1.0"
