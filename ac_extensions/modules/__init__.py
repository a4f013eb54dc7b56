"""Networks and TensorDict wrappers (torch, tensordict.nn, torchrl.modules). No loss math."""
