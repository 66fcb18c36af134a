"""The models of the training example: a small motion CNN for the CPU demo, torchvision's video ResNets.

``examples/train_ddp.py --model NAME`` builds one of :data:`MODELS` with
:func:`build_model`. Installed as ``daliload.examples.models`` (a symbolic
link, like ``train_ddp.py``), which is where the training script imports it from.
"""

from __future__ import annotations

import torch
import torch.nn as nn

MODELS = ("small3d", "r3d_18", "r2plus1d_18")


class Small3DCNN(nn.Module):
    """A small 3D CNN (0.3 M parameters at ``width=16``) that learns motion in minutes on a CPU.

    It looks at motion only: its input is the difference between consecutive
    clip frames (the "RGB difference" modality of temporal segment networks),
    so a T-frame clip gives T - 1 difference frames. The generated classes of
    ``daliload synth`` differ only by how an object moves, with random
    textures and colours; on raw RGB this model first memorises appearance and
    needs several times more clips to generalise. For real Kinetics, where
    appearance matters, use ``--model r2plus1d_18`` or ``r3d_18``.

    Four conv-BN-ReLU blocks: the stem halves height and width, the next three
    halve time, height and width; global average pooling then makes any clip
    of at least 2 frames and 16x16 pixels work.
    """

    def __init__(self, num_classes: int, width: int = 16, dropout: float = 0.2) -> None:
        super().__init__()
        widths = (width, 2 * width, 4 * width, 8 * width)

        def block(c_in: int, c_out: int, kernel: tuple, stride: tuple) -> nn.Sequential:
            padding = tuple(k // 2 for k in kernel)
            return nn.Sequential(nn.Conv3d(c_in, c_out, kernel, stride, padding, bias=False),
                                 nn.BatchNorm3d(c_out), nn.ReLU(inplace=True))

        self.features = nn.Sequential(
            block(3, widths[0], (3, 5, 5), (1, 2, 2)),
            block(widths[0], widths[1], (3, 3, 3), (2, 2, 2)),
            block(widths[1], widths[2], (3, 3, 3), (2, 2, 2)),
            block(widths[2], widths[3], (3, 3, 3), (2, 2, 2)),
        )
        self.head = nn.Sequential(nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Dropout(dropout),
                                  nn.Linear(widths[3], num_classes))

    def forward(self, videos: torch.Tensor) -> torch.Tensor:  # (B, C, T, H, W) -> (B, classes)
        if videos.shape[2] < 2:
            raise ValueError(f"small3d needs clips of at least 2 frames, got {videos.shape[2]} "
                             "(--clip-len)")
        motion = videos[:, :, 1:] - videos[:, :, :-1]
        return self.head(self.features(motion))


def check_model_name(name: str) -> None:
    """Fail before any data work if model ``name`` cannot be built here."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    if name != "small3d":
        try:
            import torchvision  # noqa: F401
        except ImportError as err:
            raise ImportError(f"--model {name} needs torchvision, which is not installed: "
                              "pip install torchvision (the build matching your torch), "
                              "or use --model small3d") from err


def build_model(name: str, num_classes: int) -> nn.Module:
    """``small3d``, or torchvision's ``r3d_18`` / ``r2plus1d_18`` (randomly initialised)."""
    check_model_name(name)
    if name == "small3d":
        return Small3DCNN(num_classes)
    from torchvision.models import video

    return getattr(video, name)(weights=None, num_classes=num_classes)
