"""autotuner: measure, don't guess, the fastest verl RL-training configuration."""

__version__ = "0.1.0"
