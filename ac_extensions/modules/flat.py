"""Contiguous parameter and gradient storage: one tensor op per optimiser step, not one per layer.

For small networks (the 2×64 MLPs of CartPole) a gradient step's clipping, optimiser update
and gradient reset cost more than its matrix products, because each walks the parameter list
and launches a few ops per tensor. :class:`FlatParameters` moves every parameter into one
contiguous buffer (the modules keep their ``nn.Parameter`` objects, now views into it) and
every gradient into a second one, so the three become one op each on a ``[P]`` tensor.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn


class FlatParameters:
    """Views a set of parameters (and their gradients) as one flat ``[P]`` parameter.

    After construction each parameter's ``.data`` is a view into :attr:`parameter` and its
    ``.grad`` a view into :attr:`parameter`'s gradient buffer; backward accumulates into those
    views in place. Give :attr:`parameter` to the optimiser, and use :meth:`zero_grad` and
    :meth:`clip_grad_norm_` instead of the optimiser's / ``torch.nn.utils``' versions. Values,
    ``state_dict`` loading (``copy_`` into the views) and modules are unchanged; only the
    optimiser sees one tensor instead of many (its ``state_dict`` has one entry).

    Build it after the modules are on their final device: ``.to()`` replaces parameter data
    and would break the views (:meth:`check` then raises).

    Args:
        parameters: the parameters to flatten (duplicates are taken once); all on one device,
            of one floating dtype, requiring gradients.

    Example:
        >>> import torch
        >>> net = torch.nn.Linear(3, 2)
        >>> flat = FlatParameters(net.parameters())
        >>> optimizer = torch.optim.SGD([flat.parameter], lr=0.1)
        >>> flat.zero_grad()
        >>> net(torch.ones(1, 3)).sum().backward()
        >>> flat.parameter.grad.tolist()
        [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    """

    def __init__(self, parameters: Iterable[nn.Parameter]) -> None:
        params: list[nn.Parameter] = []
        seen: set[int] = set()
        for p in parameters:
            if id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        if not params:
            raise ValueError("FlatParameters needs at least one parameter")
        first = params[0]
        for i, p in enumerate(params):
            if not p.requires_grad:
                raise ValueError(f"parameter {i} (shape {list(p.shape)}) does not require grad")
            if p.device != first.device or p.dtype != first.dtype:
                raise ValueError(
                    f"parameter {i} is {p.dtype} on {p.device}; expected {first.dtype} on "
                    f"{first.device} like parameter 0 (one buffer holds one device and dtype)"
                )
        with torch.no_grad():
            data = torch.cat([p.detach().reshape(-1) for p in params])
        self.parameter = nn.Parameter(data)
        """The flat ``[P]`` parameter to optimise."""
        self.grad = torch.zeros_like(data)
        """The flat ``[P]`` gradient buffer (``parameter.grad`` during :meth:`clip_grad_norm_`
        and the optimiser step)."""
        self.parameters = params
        self._grad_views: list[Tensor] = []
        offset = 0
        for p in params:
            n = p.numel()
            p.data = self.parameter.data[offset : offset + n].view_as(p)
            self._grad_views.append(self.grad[offset : offset + n].view_as(p))
            offset += n
        self.attach_grads()

    def attach_grads(self) -> None:
        """Point every parameter's ``.grad`` (and the flat parameter's) at the gradient buffer.

        Needed again only after something replaced them (e.g. a per-parameter optimiser's
        ``zero_grad(set_to_none=True)``); :meth:`check` tells.
        """
        for p, view in zip(self.parameters, self._grad_views, strict=True):
            p.grad = view
        self.parameter.grad = self.grad

    def zero_grad(self) -> None:
        """Zero the gradient buffer (one op); re-attach it to the flat parameter if detached."""
        self.grad.zero_()
        self.parameter.grad = self.grad

    def check(self) -> None:
        """Raise if a parameter's data or gradient is no longer a view into the buffers.

        That happens after ``module.to(...)``, ``module.zero_grad()`` /
        ``optimizer.zero_grad()`` on the original parameters (``set_to_none``), or assigning
        new tensors; the optimiser would then silently stop training those parameters.
        """
        base, grad = self.parameter.data.data_ptr(), self.grad.data_ptr()
        size = self.parameter.element_size()
        offset = 0
        for i, p in enumerate(self.parameters):
            if p.data_ptr() != base + offset * size:
                raise RuntimeError(
                    f"parameter {i} (shape {list(p.shape)}) no longer lives in the flat buffer "
                    "(moved with .to() or replaced?): build FlatParameters after the last move"
                )
            if p.grad is None or p.grad.data_ptr() != grad + offset * size:
                raise RuntimeError(
                    f"the gradient of parameter {i} (shape {list(p.shape)}) is no longer a view "
                    "into the flat buffer (zero_grad(set_to_none=True) on the module or its "
                    "optimiser?): use FlatParameters.zero_grad()"
                )
            offset += p.numel()

    def clip_grad_norm_(self, max_norm: float) -> Tensor:
        """Scale the gradients in place so their global L2 norm is at most ``max_norm``.

        The same rule as ``torch.nn.utils.clip_grad_norm_`` (coefficient
        ``max_norm / (norm + 1e-6)``, clamped at 1), on the single buffer.

        Returns:
            The norm before clipping (a 0-d tensor; NaN/inf if a gradient is non-finite).
        """
        self.parameter.grad = self.grad
        norm = torch.linalg.vector_norm(self.grad)
        self.grad.mul_((max_norm / (norm + 1e-6)).clamp_(max=1.0))
        return norm


__all__ = ["FlatParameters"]
