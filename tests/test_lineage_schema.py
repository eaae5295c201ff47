"""The OpenLineage ``walsink`` run facet names its schema, and that schema ships with the
docs and describes the fields the facet really has (issue 25: the URL named a repository
that does not exist)."""

from __future__ import annotations

import json
import typing
from urllib.parse import urlsplit

import attr
import pytest

from tests.helpers import REPO

pytest.importorskip("openlineage.client")

from airflow_provider_walsink.core.protocol.states import CheckpointState  # noqa: E402
from airflow_provider_walsink.operators.lineage import WalsinkCheckpointRunFacet, operator_lineage  # noqa: E402

_JSON_TYPES = {str: "string", int: "integer", type(None): "null"}


def _schema_and_definition() -> tuple[dict, dict]:
    url = urlsplit(WalsinkCheckpointRunFacet(pipeline="p", checkpointKey="k")._schemaURL)
    path = REPO / url.path
    assert not url.scheme and not url.netloc, "a reference into walsink's own docs"
    assert path.is_file(), f"{url.path} is not shipped in the docs"
    schema = json.loads(path.read_text(encoding="utf-8"))
    node = schema
    for part in url.fragment.strip("/").split("/"):  # a JSON pointer into the file
        node = node[part]
    return schema, node


def test_the_facets_schema_url_names_a_schema_shipped_in_the_docs():
    schema, definition = _schema_and_definition()
    assert definition is schema["$defs"]["WalsinkCheckpointRunFacet"]
    assert schema["properties"]["walsink"] == {"$ref": "#/$defs/WalsinkCheckpointRunFacet"}
    lineage = operator_lineage(summary=None, pipeline="p", checkpoint_key="k", output_uri=None)
    assert "walsink" in lineage.run_facets  # the key the schema's top level describes


def test_the_schema_describes_the_fields_the_facet_has():
    _, definition = _schema_and_definition()
    own = definition["allOf"][1]
    fields = {f.name: f for f in attr.fields(WalsinkCheckpointRunFacet) if not f.name.startswith("_")}
    assert set(own["properties"]) == set(fields)
    assert set(own["required"]) == {n for n, f in fields.items() if f.default is attr.NOTHING}
    hints = typing.get_type_hints(WalsinkCheckpointRunFacet)
    for name, prop in own["properties"].items():
        declared = {_JSON_TYPES[t] for t in (typing.get_args(hints[name]) or (hints[name],))}
        assert set(prop["type"] if isinstance(prop["type"], list) else [prop["type"]]) == declared, name
        assert prop["description"], name
    states = {s.value for s in CheckpointState}
    assert set(own["properties"]["state"]["enum"]) - {None} == states


def test_a_real_facet_validates_against_the_schema():
    jsonschema = pytest.importorskip("jsonschema")
    from openlineage.client.serde import Serde

    _, definition = _schema_and_definition()
    facet = WalsinkCheckpointRunFacet(
        pipeline="daily_events",
        checkpointKey="20260101T000000Z",
        attempt=2,
        attemptId="0" * 32,
        state="COMMITTED",
        committables=3,
        rows=42,
    )
    document = json.loads(Serde.to_json(facet))
    assert document["_schemaURL"] == facet._schemaURL
    jsonschema.validate(document, definition["allOf"][1])  # the walsink part (the base is OpenLineage's)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**document, "rows": "many"}, definition["allOf"][1])
