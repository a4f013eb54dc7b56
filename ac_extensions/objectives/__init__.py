"""TorchRL ``LossModule`` subclasses over :mod:`ac_extensions.functional`."""
