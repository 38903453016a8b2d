"""Markdown for the pages people read in the Prefect UI (artifacts, the model card), shared by every stage that
writes one; no Prefect, no torch.

    pictures.py   a PNG inline in markdown (a data URI): the UI shows it with no file server
"""

from tasks.markdown.pictures import png_markdown, png_markdown_of

__all__ = ["png_markdown", "png_markdown_of"]
