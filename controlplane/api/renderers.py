"""The API's JSON, written by orjson.

DRF's renderer spent a page's worth of Python on `json.dumps` for list pages of 50 deployments
with two full Serve configs each. orjson writes the same document: compact, UTF-8, keys in
order, U+2028 and U+2029 escaped. Values orjson does not write itself (datetimes, Decimals, lazy
strings, anything odd) go through DRF's own encoder, so they read as before; a document orjson
refuses (an integer past 64 bits) and pretty-printing (`; indent=`, the browsable API) are
written by DRF's renderer. One difference: a NaN or infinite float is written as null, where
DRF's strict renderer failed the whole response.
"""

from __future__ import annotations

import orjson
from rest_framework.renderers import JSONRenderer
from rest_framework.utils.encoders import JSONEncoder

OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


class FastJSONRenderer(JSONRenderer):
    _encoder = JSONEncoder()

    def render(self, data, accepted_media_type=None, renderer_context=None):
        if data is None:
            return b""
        if self.get_indent(accepted_media_type, renderer_context or {}) is not None:
            return super().render(data, accepted_media_type, renderer_context)
        try:
            body = orjson.dumps(data, default=self._encoder.default, option=OPTIONS)
        except orjson.JSONEncodeError:
            return super().render(data, accepted_media_type, renderer_context)
        if b"\xe2\x80\xa8" in body or b"\xe2\x80\xa9" in body:
            body = body.replace("\u2028".encode(), b"\\u2028").replace("\u2029".encode(), b"\\u2029")
        return body
