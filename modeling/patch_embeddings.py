"""Patch embeddings: an image becomes a sequence of tokens.

A Conv2D whose kernel and stride are the patch size cuts the image into patches and projects each to the model
width; a learned [CLS] token goes in front and learned positions are added. The position table covers the
training image size; for other sizes the patch-position grid is resized bicubically (the [CLS] position is kept).

Shapes: B batch, Ch image channels, Hi image height, Wi image width, Gh patch-grid height, Gw patch-grid width,
N tokens (the Gh * Gw patches), C channels.
"""

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class PatchEmbeddingSpec:
    image_size: tuple[int, int]  # (height, width) the position table was trained for
    patch_size: tuple[int, int]
    num_channels: int
    hidden_size: int
    dropout: float

    @property
    def grid(self) -> tuple[int, int]:
        return self.image_size[0] // self.patch_size[0], self.image_size[1] // self.patch_size[1]


def resize_positions(
    positions: torch.Tensor,  # [1, 1 + Gh * Gw, C]: the [CLS] position, then the patch grid row by row
    grid: tuple[int, int],
    new_grid: tuple[int, int],
) -> torch.Tensor:  # [1, 1 + Gh' * Gw', C]
    """Bicubic resize of the patch-position grid, as transformers' ViT does (align_corners=False)."""
    cls_pos, patch_pos = positions[:, :1], positions[:, 1:]
    dim = positions.shape[-1]
    patch_pos = patch_pos.reshape(1, grid[0], grid[1], dim).permute(0, 3, 1, 2)  # [1, C, Gh, Gw]
    patch_pos = nn.functional.interpolate(patch_pos, size=new_grid, mode="bicubic", align_corners=False)
    patch_pos = patch_pos.permute(0, 2, 3, 1).reshape(1, -1, dim)  # [1, Gh' * Gw', C]
    return torch.cat((cls_pos, patch_pos), dim=1)


class PatchEmbeddings(nn.Module):
    def __init__(self, spec: PatchEmbeddingSpec):
        super().__init__()
        self.spec = spec
        self.cls_token = nn.Parameter(torch.zeros(1, 1, spec.hidden_size))
        self.patch_proj = nn.Conv2d(
            spec.num_channels, spec.hidden_size, kernel_size=spec.patch_size, stride=spec.patch_size
        )
        num_patches = spec.grid[0] * spec.grid[1]
        self.position_embeddings = nn.Parameter(torch.zeros(1, num_patches + 1, spec.hidden_size))
        self.dropout = nn.Dropout(spec.dropout)

    def check_pixels(self, pixel_values: torch.Tensor | None, interpolate: bool) -> None:
        if pixel_values is None:
            raise ValueError("pass pixel_values: images as a [batch, channels, height, width] tensor")
        if not isinstance(pixel_values, torch.Tensor):
            raise ValueError(f"pixel_values must be a torch tensor of images, got a {type(pixel_values).__name__}")
        if pixel_values.dim() != 4:
            raise ValueError(
                f"pixel_values must be [batch, channels, height, width], got shape {tuple(pixel_values.shape)}"
            )
        batch, channels, height, width = pixel_values.shape
        if batch == 0:
            raise ValueError(f"pixel_values has shape {list(pixel_values.shape)}: at least one image is needed")
        if channels != self.spec.num_channels:
            raise ValueError(
                f"pixel_values have {channels} channels, the model expects {self.spec.num_channels} (num_channels)"
            )
        (h, w), (ph, pw) = self.spec.image_size, self.spec.patch_size
        if not interpolate and (height, width) != (h, w):
            raise ValueError(
                f"input image size ({height}*{width}) doesn't match the model's image size ({h}*{w}); resize the "
                "images, or pass interpolate_pos_encoding=True to interpolate the position embeddings"
            )
        if height < ph or width < pw:
            raise ValueError(f"input image size ({height}*{width}) is smaller than one patch ({ph}*{pw})")

    def positions_for(self, height: int, width: int) -> torch.Tensor:  # [1, 1 + N, C]
        new_grid = (height // self.spec.patch_size[0], width // self.spec.patch_size[1])
        # Always resized under tracing, so that an exported model accepts every image size.
        if new_grid == self.spec.grid and not torch.jit.is_tracing():
            return self.position_embeddings
        return resize_positions(self.position_embeddings, self.spec.grid, new_grid)

    def forward(
        self,
        pixel_values: torch.Tensor,  # [B, Ch, Hi, Wi]
        interpolate_pos_encoding: bool = False,
    ) -> torch.Tensor:  # [B, 1 + N, C]
        self.check_pixels(pixel_values, interpolate_pos_encoding)
        batch, _, height, width = pixel_values.shape
        patches = self.patch_proj(pixel_values.to(self.patch_proj.weight.dtype))  # [B, C, Gh, Gw]
        patches = patches.flatten(2).transpose(1, 2)  # [B, N, C]
        hidden = torch.cat((self.cls_token.expand(batch, -1, -1), patches), dim=1)  # [B, 1 + N, C]
        return self.dropout(hidden + self.positions_for(height, width))
