"""Secrets that configuration files set apart from their names: a YAML block scalar (the
value on the lines below ``PASSWORD: >-``), and a name and value pair (Kubernetes and
docker-compose environments, ECS and CloudFormation JSON, Terraform, .NET settings).
The rest of the file stays, and so do pairs and blocks that hold no credential."""

from __future__ import annotations

import pytest

from recalld.daemon.memory.redact import MASK, redact

VALUE = "Qh4nV8sW2pXc"


@pytest.mark.parametrize(("text", "secret"), [
    (f"db:\n  PASSWORD: >-\n    {VALUE}\n  host: db01\n", VALUE),
    (f"db:\n  password: |\n    {VALUE}\n  user: bob\n", VALUE),
    ("wifi:\n  passphrase: >\n    correct horse battery\n    staple\n  band: 5ghz\n",
     "horse battery"),
    ("smtp:\n  pass: |-\n    bluebird\n", "bluebird"),
    (f"auth:\n  api_key: >-  # from the vendor\n    {VALUE}\n", VALUE),
    (f"env:\n- name: DB_PASS\n  value: {VALUE}\n- name: PORT\n  value: '5432'\n", VALUE),
    (f"env:\n  - name: API_TOKEN\n    value: \"{VALUE}\"\n", VALUE),
    ("environment:\n  - name: SMTP_PASSWORD\n    # set by ops\n    value: bluebird\n",
     "bluebird"),
    (f'"environment": [{{"name": "DB_PASSWORD", "value": "{VALUE}"}}]', VALUE),
    (f'{{"ParameterKey": "DbPassword", "ParameterValue": "{VALUE}"}}', VALUE),
    (f'env {{\n  name  = "STRIPE_SECRET"\n  value = "{VALUE}"\n}}', VALUE),
    (f'<add key="DbPassword" value="{VALUE}" />', VALUE),
    ('<add key="SmtpPassword" value="bluebird"/>', "bluebird"),
])
def test_a_value_set_apart_from_its_name_is_masked(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out and MASK in out, out


def test_only_the_value_is_masked() -> None:
    text = (f"db:\n  password: >-\n    {VALUE}\n  host: db01\nenv:\n"
            f"- name: DB_PASS\n  value: {VALUE}\n- name: PORT\n  value: 5432\n")
    assert redact(text) == ("db:\n  password: >-\n    " + MASK + "\n  host: db01\nenv:\n"
                            f"- name: DB_PASS\n  value: {MASK}\n- name: PORT\n  value: 5432\n")


@pytest.mark.parametrize("text", [
    "env:\n- name: DB_PASS\n  valueFrom:\n    secretKeyRef:\n      name: db\n      key: pass\n",
    "env:\n- name: DB_PASSWORD_FILE\n  value: /run/secrets/db_password\n",
    "env:\n- name: API_TOKEN\n  value: ${API_TOKEN}\n",
    "env:\n- name: TOKEN_TTL\n  value: '3600'\n",
    "env:\n- name: DB_PASS\n- name: PORT\n  value: '5432'\n",
    '<add key="PageSize" value="20"/>',
    '{"name": "password", "type": "string", "value": "required"}',
    "description: >-\n  The password policy asks for twelve characters\n  and a digit.\n",
    "token_ttl: >\n  3600\n",
    "password: |\n\nnext: 1\n",
    "notes:\n  key: >\n    the primary key of the table\n",
])
def test_pairs_and_blocks_without_a_credential_stay(text: str) -> None:
    assert redact(text) == text
