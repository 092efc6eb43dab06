"""What the consumer's options cost to import: `hakafka.config` holds `Format`, `OnError` and
`DecodeOptions` from `hakafka.consumer`, which loads no format's parser for them: each
format's decoder module is imported by `make_decoder` when a pipeline asks for it."""

from __future__ import annotations

import json

from tests.fresh import fresh_python, loaded

PARSERS = ["pyarrow.csv", "pyarrow.json", "fastavro", "google.protobuf"]

# Imports the config in a fresh interpreter, then prints every loaded module.
_PROBE = """
import json, sys
import hakafka.config
print(json.dumps(sorted(sys.modules)))
"""


def test_the_config_loads_no_parser_of_a_format() -> None:
    modules = json.loads(fresh_python(_PROBE).splitlines()[-1])
    assert "hakafka.consumer.options" in modules
    assert loaded(PARSERS, modules) == []
