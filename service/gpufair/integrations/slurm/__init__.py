"""The Slurm bridge: gpufair places the jobs of a Slurm cluster (see docs/slurm.md)."""
