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
    # A default value (Helm charts, CI parameters), with no other value field in the text.
    (f"parameters:\n- name: DB_PASSWORD\n  default: {VALUE}\n", VALUE),
    (f'variable {{\n  name    = "smtp_secret"\n  Default = "{VALUE}"\n}}', VALUE),
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


@pytest.mark.parametrize(("text", "secret"), [
    (f'  <password value="{VALUE}"/>', VALUE),
    (f"<apiToken name='prod' value='{VALUE}' />", VALUE),
    (f"Password:\n{VALUE}\n", VALUE),
    (f"**Wifi password:**\n`{VALUE}`\nask me if it fails", VALUE),
    (f"db password:\n    {VALUE}", VALUE),
    (f"os.environ['DB_PASSWORD'] = '{VALUE}'", VALUE),
    (f'config["api_token"] = "{VALUE}"', VALUE),
    (f"db.example.com:5432:app:bob:{VALUE}", VALUE),
    (f"*:*:*:postgres:{VALUE}", VALUE),
    (f"The wifi password? It's {VALUE}", VALUE),
    (f"la clave es {VALUE}", VALUE),
    (f"mdp : {VALUE}", VALUE),
])
def test_more_layouts_of_a_credential_are_masked(text: str, secret: str) -> None:
    """An XML element named as the credential, a label line above its value, a subscript
    assignment, a PostgreSQL password file line, a question answered, Spanish and French
    shorthand."""
    out = redact(text)
    assert secret not in out and MASK in out, out


@pytest.mark.parametrize("text", [
    "Password:\nthe one we agreed on\n",
    "Password:\nREADME.md\n",
    "Token:\nv2.3.1\n",
    "Secret:\n2026-01-05\n",
    "API key:\nrotate_monthly\n",
    "Password:\nsee_the_vault()\n",
    "the token value is documented below",
    "Note: 12:30:00:00:00",
    "la clave es la paciencia",
    "The wifi password? It's on the fridge",
    '<password required="true"/>',
])
def test_look_alikes_of_those_layouts_stay(text: str) -> None:
    assert redact(text) == text


def test_an_attribute_after_a_credential_word_is_not_taken_for_its_value() -> None:
    """``<password value="...">`` lost ``value=`` and kept the password."""
    assert redact(f'<password value="{VALUE}"/>') == f'<password value="{MASK}"/>'
