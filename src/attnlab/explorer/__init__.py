"""The attention explorer: one self-contained, offline HTML page of a run's (or one input's) attention maps.

:class:`~attnlab.explorer.record.ExplorerRecord` keeps the captured maps of every logged epoch, 8-bit quantized;
:func:`~attnlab.explorer.page.write_page` writes them with the viewer (``template.html``: inline JS and CSS, no
request to any file or host) into one HTML file. The attention-map callback fills a record at its interval and
``python -m attnlab.explore`` fills one from a checkpoint and any input (docs/explorer.md).
"""

from .page import page_html, write_page
from .record import ExplorerRecord, dequantize, quantize

__all__ = ["ExplorerRecord", "quantize", "dequantize", "page_html", "write_page"]
