"""Secrets out of text that is logged or raised: URLs and the error messages that quote them."""

from __future__ import annotations

import re

MASK = "***"

# A parameter whose name says it holds a secret: `;token=` (Spark Connect), `?password=`, ...
_SECRET_PARAM = re.compile(
    r"(?i)(\b[\w.-]*(?:token|password|passwd|secret|credential|api[_-]?key|access[_-]?key)"
    r"[\w.-]*=)[^;&\s'\"]*"
)
# The password of `scheme://user:password@host`.
_USERINFO = re.compile(r"(://[^/\s:@]*:)[^@/\s]*(@)")


def redact(text: str) -> str:
    """`text` with the value of every secret-named `key=value` parameter (token, password,
    secret, credential, api/access key; as in `sc://host:15002/;token=...` or
    `https://h/?password=...`) and every URL's `user:password@` password replaced by `***`.
    Use it on any URL, or message quoting one, before it is logged or raised."""
    return _USERINFO.sub(rf"\g<1>{MASK}\g<2>", _SECRET_PARAM.sub(rf"\g<1>{MASK}", text))
