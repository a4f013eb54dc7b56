"""TorchRL ``LossModule`` subclasses: read keys, call networks and :mod:`ac_extensions.functional`."""
