"""Code that runs inside training processes: trainer, checkpoints, preemption, events, the user SDK."""
