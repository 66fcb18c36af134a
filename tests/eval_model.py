"""A deterministic stand-in for a video model, for the evaluation tests (also imported by torchrun workers)."""

from __future__ import annotations

import torch


class ChannelMeans(torch.nn.Module):
    """Logits from each clip's per-channel, per-frame means through fixed weights (seeded): no training, no state.

    Takes ``(N, C, T, H, W)``; ``num_classes`` logits that differ from clip to clip.
    """

    def __init__(self, num_classes: int = 7, frames: int = 4, channels: int = 3) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(1234)
        self.weight = torch.nn.Parameter(torch.randn(num_classes, channels * frames, generator=generator) * 4,
                                         requires_grad=False)
        self.calls: list[int] = []

    def forward(self, clips: torch.Tensor) -> torch.Tensor:
        self.calls.append(clips.shape[0])
        features = clips.float().mean(dim=(3, 4)).flatten(1)  # (N, C*T)
        return features @ self.weight.T
