"""trainyard: train and fine-tune models on heterogeneous accelerators at the lowest expected cost."""

__version__ = "0.1.0"
