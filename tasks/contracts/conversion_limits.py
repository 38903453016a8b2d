"""ConversionLimits: what one conversion may unpack and decode, the flows' ``conversion`` parameter."""

from __future__ import annotations

from pydantic import BaseModel, Field

DEFAULT_MAX_EXTRACTED_BYTES = 64 * 2**30
# A 48-megapixel phone photo fits; Pillow's own decompression-bomb warning starts at ~89 MP.
DEFAULT_MAX_IMAGE_PIXELS = 50_000_000
DEFAULT_DECODE_MEMORY_BYTES = 2**30


class ConversionLimits(BaseModel):
    """What one conversion may unpack and decode: the bounds that keep a hostile or huge source from filling
    the disk or the memory. The flows take it as their ``conversion`` parameter (a form in the UI)."""

    max_extracted_bytes: int = Field(
        DEFAULT_MAX_EXTRACTED_BYTES,
        gt=0,
        description="Most bytes an archive or S3 prefix may unpack or download (larger ones are refused as archive bombs)",
    )
    max_image_pixels: int = Field(
        DEFAULT_MAX_IMAGE_PIXELS,
        gt=0,
        description="Largest image in pixels (width x height); larger ones are quarantined from their header, never decoded",
    )
    decode_memory_bytes: int = Field(
        DEFAULT_DECODE_MEMORY_BYTES,
        gt=0,
        description="Decoded pixels, in bytes, that all decoding threads may hold at once",
    )
