"""torch's own Python utilities made to take torch handles where their C half refuses them.

`torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)`, in nearly every training loop,
first groups the gradients by device and dtype with a C function that takes real tensors
only ("incompatible function arguments" for handles), then runs calls that do reach
`__torch_function__`. The grouping is done here for lists of handles, from their metadata;
any other list goes to torch's own.
"""

from __future__ import annotations

from typing import Any


def clip_grad_takes(torch: Any, handle_class: type) -> None:
    """Have torch's gradient clipping group lists of `handle_class` handles (once)."""
    from torch.nn.utils import clip_grad

    original = clip_grad._group_tensors_by_device_and_dtype
    if getattr(original, "takes_handles", False):
        return

    def grouped(tensorlistlist, with_indices: bool = False):
        """torch's grouping by (device, dtype) of the first list's tensors, for handles too."""
        first = tensorlistlist[0] if tensorlistlist else ()
        if not any(isinstance(t, handle_class) for t in first):
            return original(tensorlistlist, with_indices)
        groups: dict = {}
        for i, tensor in enumerate(first):
            lists, indices = groups.setdefault((tensor.device, tensor.dtype),
                                               ([[] for _ in tensorlistlist], []))
            for kept, tensors in zip(lists, tensorlistlist, strict=True):
                kept.append(tensors[i])
            indices.append(i)
        return groups

    grouped.takes_handles = True  # type: ignore[attr-defined]
    clip_grad._group_tensors_by_device_and_dtype = grouped
