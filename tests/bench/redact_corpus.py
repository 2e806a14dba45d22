"""A labelled corpus of generated secrets in realistic sentences, for the redaction benchmark.

Every secret is made up here from a seeded random generator in the shape its issuer uses
(prefixes, alphabets, lengths, armour lines); none is real. Each item says which strings
must not survive redaction (``hide``): the whole secret, and for long ones each third of
it, so a redaction that leaves half a key visible counts as a miss.

    .venv/bin/python tests/bench/redact_corpus.py --seed 7 --per-kind 8   # prints JSON lines
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import random
import string
import sys
from collections.abc import Callable
from dataclasses import dataclass

B62 = string.ascii_letters + string.digits
B64 = B62 + "+/"
URLSAFE = B62 + "-_"
HEX = "0123456789abcdef"
UPPER_NUM = string.ascii_uppercase + string.digits
WORDS = ("correct horse battery staple orange rocket violin marble tiger canyon lantern "
         "pepper meadow silver thunder window falcon cactus harbor velvet copper river "
         "glacier puzzle saddle walnut").split()


@dataclass(frozen=True, slots=True)
class Item:
    kind: str
    text: str
    secret: str
    hide: tuple[str, ...]


def _r(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _mixed(rng: random.Random, alphabet: str, n: int) -> str:
    """Random characters with at least one digit, one upper and one lower case letter
    where the alphabet has them (a token without is rare at these lengths)."""
    wanted = [kind for kind in (str.isdigit, str.isupper, str.islower)
              if any(kind(c) for c in alphabet)]
    while True:
        s = _r(rng, alphabet, n)
        if all(any(kind(c) for c in s) for kind in wanted):
            return s


def _b64_lines(rng: random.Random, lines: int) -> str:
    raw = bytes(rng.randrange(256) for _ in range(48 * lines))
    text = base64.b64encode(raw).decode()
    return "\n".join(text[i:i + 64] for i in range(0, len(text), 64))


def _pem(label: str) -> Callable[[random.Random], str]:
    def make(rng: random.Random) -> str:
        body = _b64_lines(rng, rng.randint(4, 9))
        extra = ""
        if label == "RSA" and rng.random() < 0.3:
            iv = _r(rng, HEX.upper(), 32)
            extra = f"Proc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,{iv}\n\n"
        head = f"{label} PRIVATE KEY" if label else "PRIVATE KEY"
        return f"-----BEGIN {head}-----\n{extra}{body}\n-----END {head}-----"
    return make


def _pgp(rng: random.Random) -> str:
    body = _b64_lines(rng, rng.randint(5, 9))
    return (f"-----BEGIN PGP PRIVATE KEY BLOCK-----\nComment: exported\n\n{body}\n"
            f"={_r(rng, B64, 4)}\n-----END PGP PRIVATE KEY BLOCK-----")


def _putty(rng: random.Random) -> str:
    return ("PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nComment: laptop\n"
            f"Public-Lines: 2\n{_b64_lines(rng, 1)}\nPrivate-Lines: 1\n{_b64_lines(rng, 1)}\n"
            f"Private-MAC: {_r(rng, HEX, 64)}")


def _jwt(rng: random.Random) -> str:
    def seg(obj: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")
    head = seg({"alg": rng.choice(["HS256", "RS256"]), "typ": "JWT"})
    body = seg({"sub": str(rng.randrange(10**9)), "name": rng.choice(WORDS),
                "iat": rng.randrange(1_600_000_000, 1_800_000_000)})
    return f"{head}.{body}.{_r(rng, URLSAFE, 43)}"


def _gcp(rng: random.Random) -> str:
    key = _pem("")(rng).replace("\n", "\\n")
    return key


def _passphrase(rng: random.Random) -> str:
    return " ".join(rng.sample(WORDS, rng.randint(3, 5)))


def _password(rng: random.Random) -> str:
    core = _r(rng, string.ascii_letters, rng.randint(4, 7))
    digits = _r(rng, string.digits, rng.randint(1, 3))
    return core + digits + rng.choice("!@#$%&*?") * rng.randint(0, 1)


#: kind -> (secret maker, sentence templates with {s})
KINDS: dict[str, tuple[Callable[[random.Random], str], tuple[str, ...]]] = {
    "pem_rsa": (_pem("RSA"), ("here is the deploy key:\n{s}\nplease keep it safe",
                              "```\n{s}\n```", "key file contents: {s}")),
    "pem_ec": (_pem("EC"), ("the signing key for the staging box\n{s}",
                            "I pasted the EC key below\n\n{s}\n\nthanks")),
    "pem_dsa": (_pem("DSA"), ("old DSA key from the backup server:\n{s}",)),
    "pem_pkcs8": (_pem(""), ("cert.key:\n{s}\n", "The TLS private key is\n{s}")),
    "pem_encrypted": (_pem("ENCRYPTED"), ("encrypted key (passphrase elsewhere)\n{s}",)),
    "openssh": (_pem("OPENSSH"), ("my ssh key ~/.ssh/id_ed25519:\n{s}",
                                  "cat id_rsa gives\n{s}\nis that right?")),
    "pgp_private": (_pgp, ("My PGP secret key, for the record:\n{s}",
                           "gpg --export-secret-keys output:\n{s}")),
    "putty": (_putty, ("the .ppk file says\n{s}", "PuTTY key for the router:\n{s}")),
    "aws_access_key_id": (lambda r: rng_choice(r, ["AKIA", "ASIA"]) + _r(r, UPPER_NUM, 16),
                          ("aws_access_key_id = {s}", "The access key id {s} belongs to ci-bot.",
                           "use {s} for the uploader")),
    "aws_secret_prose": (lambda r: _mixed(r, B64, 40),
                         ("the AWS secret key is {s}, don't share it",
                          "aws secret: {s}", "AWS_SECRET_ACCESS_KEY={s}",
                          "and the secret access key {s} goes into the profile",
                          "Secret for the bucket user -> {s}")),
    "gcp_service_account": (_gcp, ('{{"type": "service_account", "project_id": "demo", '
                                   '"private_key": "{s}", "client_email": "x@demo.iam"}}',)),
    "gcp_oauth_secret": (lambda r: "GOCSPX-" + _mixed(r, URLSAFE, 28),
                         ("client secret {s} for the desktop app", "oauth: {s}")),
    "azure_storage": (lambda r: _mixed(r, B64, 86) + "==",
                      ("DefaultEndpointsProtocol=https;AccountName=demo;AccountKey={s};"
                       "EndpointSuffix=core.windows.net",
                       "storage account key: {s}")),
    "azure_client_secret": (lambda r: _r(r, B62, 3) + str(r.randrange(10)) + "Q~"
                            + _mixed(r, B62 + "_~.-", 34),
                            ("AZURE_CLIENT_SECRET={s}", "the app registration secret is {s}")),
    "github_pat": (lambda r: rng_choice(r, ["ghp_", "gho_", "ghs_", "ghu_"]) + _mixed(r, B62, 36),
                   ("export GITHUB_TOKEN={s}", "my github token {s} expires friday",
                    "git clone https://{s}@github.com/acme/app.git")),
    "github_fine_grained": (lambda r: "github_pat_" + _mixed(r, B62, 22) + "_" + _mixed(r, B62, 59),
                            ("fine-grained PAT: {s}", "token={s}")),
    "gitlab": (lambda r: "glpat-" + _mixed(r, URLSAFE, 20),
               ("GITLAB_TOKEN: {s}", "the gitlab token is {s}", "use {s} in CI")),
    "slack_token": (lambda r: rng_choice(r, ["xoxb-", "xoxp-", "xoxa-", "xoxs-", "xoxr-"])
                    + f"{r.randrange(10**11, 10**12)}-{r.randrange(10**11, 10**12)}-"
                    + _mixed(r, B62, 24),
                    ("slack bot token {s}", "SLACK_TOKEN={s}", "Slack said to use {s}")),
    "slack_webhook": (lambda r: f"https://hooks.slack.com/services/T{_r(r, UPPER_NUM, 8)}/"
                      f"B{_r(r, UPPER_NUM, 8)}/{_mixed(r, B62, 24)}",
                      ("post alerts to {s}", "webhook: {s}")),
    "telegram_bot": (lambda r: f"{r.randrange(10**8, 10**10)}:AA{_mixed(r, URLSAFE, 33)}",
                     ("the telegram bot token {s}", "BOT_TOKEN={s}", "bot father gave me {s}")),
    "sendgrid": (lambda r: f"SG.{_mixed(r, URLSAFE, 22)}.{_mixed(r, URLSAFE, 43)}",
                 ("sendgrid api key {s}", "SENDGRID_API_KEY='{s}'", "mail via {s}")),
    "stripe": (lambda r: rng_choice(r, ["sk_live_", "rk_live_", "sk_test_"]) + _mixed(r, B62, 24),
               ("stripe key {s}", "STRIPE_SECRET_KEY={s}", "charge with {s} please")),
    "twilio": (lambda r: "SK" + _r(r, HEX, 32),
               ("twilio api key {s}", "TWILIO_API_KEY={s}", "the SID {s} is the key")),
    "npm": (lambda r: "npm_" + _mixed(r, B62, 36),
            ("//registry.npmjs.org/:_authToken={s}", "npm publish token {s}")),
    "pypi": (lambda r: "pypi-AgEIcHlwaS5vcmc" + _mixed(r, URLSAFE, 60),
             ("password = {s}", "twine upload with {s}")),
    "openai": (lambda r: rng_choice(r, ["sk-", "sk-proj-", "sk-svcacct-"]) + _mixed(r, URLSAFE, 48),
               ("OPENAI_API_KEY={s}", "try my openai key {s}", "the key {s} has credits")),
    "anthropic": (lambda r: "sk-ant-api03-" + _mixed(r, URLSAFE, 93) + "AA",
                  ("ANTHROPIC_API_KEY={s}", "claude key: {s}")),
    "google_api": (lambda r: "AIza" + _mixed(r, URLSAFE, 35),
                   ("maps key {s}", "GOOGLE_API_KEY={s}", "the browser key is {s}")),
    "discord_bot": (lambda r: rng_choice(r, ["M", "N", "O"]) + _mixed(r, B62, 25) + "."
                    + _mixed(r, URLSAFE, 6) + "." + _mixed(r, URLSAFE, 38),
                    ("discord bot token {s}", "DISCORD_TOKEN={s}", "login with {s}")),
    "discord_webhook": (lambda r: f"https://discord.com/api/webhooks/{r.randrange(10**17, 10**18)}/"
                        f"{_mixed(r, URLSAFE, 68)}", ("send to {s}",)),
    "mailgun": (lambda r: "key-" + _r(r, HEX, 32),
                ("mailgun key {s}", "MAILGUN_API_KEY={s}")),
    "huggingface": (lambda r: "hf_" + _mixed(r, string.ascii_letters, 34),
                    ("HF_TOKEN={s}", "huggingface token {s} for the gated model")),
    "digitalocean": (lambda r: rng_choice(r, ["dop_v1_", "doo_v1_"]) + _r(r, HEX, 64),
                     ("DIGITALOCEAN_TOKEN={s}", "doctl auth init with {s}")),
    "shopify": (lambda r: rng_choice(r, ["shpat_", "shpss_", "shpca_"]) + _r(r, HEX, 32),
                ("shopify admin token {s}", "SHOPIFY_ACCESS_TOKEN={s}")),
    "jwt": (_jwt, ("Authorization: Bearer {s}", "the session cookie was {s}",
                   "decoded {s} on jwt.io")),
    "url_password": (_password,
                     ("postgres://app:{s}@db.internal:5432/main",
                      "redis://:{s}@cache:6379/0", "https://admin:{s}@jenkins.local/job",
                      "mongodb+srv://svc:{s}@cluster0.example.net/")),
    "db_connection": (_password,
                      ("Server=sql1;Database=app;User Id=sa;Password={s};",
                       "jdbc:mysql://db/app?user=root&password={s}",
                       "Data Source=db;Uid=admin;Pwd={s};")),
    "password_assign": (_password,
                        ("password={s}", "DB_PASSWORD: {s}", '"password": "{s}"',
                         "password = '{s}'", "MYSQL_ROOT_PASSWORD={s}", "passwd {s}",
                         "<password>{s}</password>", "mysql -u root --password={s}")),
    "pw_colon": (_password, ("pw: {s}", "pwd: {s}", "PW = {s}", "wifi pw: {s}")),
    "password_prose": (_password,
                       ("the password for prod is {s}", "my email password is {s} btw",
                        "Password for the router was {s}.", "I changed the password to {s}",
                        "the admin password's {s}", "set my password to {s} yesterday")),
    "plain_word_password": (lambda r: rng_choice(r, WORDS) + rng_choice(r, WORDS),
                            ("the wifi password is {s}", "the password for prod is {s}.",
                             "password: {s}")),
    "passphrase": (_passphrase,
                   ("my passphrase is {s}", "the passphrase for the key is {s}.",
                    "passphrase: {s}", 'vault passphrase = "{s}"',
                    "my password is {s}, don't tell anyone")),
    "generic_secret_env": (lambda r: _mixed(r, B62, r.randint(24, 40)),
                           ("export APP_SECRET={s}", "client_secret: {s}", "SECRET_KEY = '{s}'",
                            "api_key={s}", "the api token is {s}", "auth token: {s}")),
    "bearer_header": (lambda r: _mixed(r, URLSAFE, r.randint(30, 60)),
                      ("curl -H 'Authorization: Bearer {s}' https://api.example.com",
                       "Authorization: Basic {s}")),
    "age_key": (lambda r: "AGE-SECRET-KEY-1" + _r(r, UPPER_NUM, 58),
                ("age key {s}", "sops uses {s}")),
    # Secrets written apart from their names, before them, or in other shapes.
    "yaml_block": (_password, ("db:\n  password: >-\n    {s}\n  host: db01\n",
                               "smtp:\n  pass: |\n    {s}\n")),
    "name_value_pair": (_password, ("env:\n- name: DB_PASS\n  value: {s}\n",
                                    '{{"name": "SMTP_PASSWORD", "value": "{s}"}}',
                                    '<add key="DbPassword" value="{s}" />')),
    "named_before": (_password, ("use {s} as the password for staging",
                                 "{s} is the wifi password", "enter {s} as your PIN")),
    "other_language": (_password, ("Das Passwort lautet {s}", "la password è {s}",
                                   "PIN码：{s}", "パスワードは{s}です")),
    "mailchimp": (lambda r: _r(r, HEX, 32) + f"-us{r.randrange(1, 21)}",
                  ("mailchimp {s}", "MC_KEY={s}")),
    "url_token": (lambda r: _mixed(r, B62, r.randint(20, 40)),
                  ("git remote add origin https://{s}@git.example.org/acme/app.git",)),
    "base64_wrapped": (lambda r: _b64_of(rng_choice(r, ["ghp_", "sk-proj-", "glpat-"])
                                         + _mixed(r, B62, 36)),
                       ("echo {s} | base64 -d", "the blob {s} from the manifest")),
    "invisible_cut": (lambda r: _invisible_cut(r),
                      ("the token is {s}", "copied from the wiki: {s}", "KEY={s}")),
}


#: Characters that show nothing, as pages and chats put them inside long words.
INVISIBLE = ("\u200b", "\u00ad", "\u2060", "\ufeff", "\u200c")


def _invisible_cut(rng: random.Random) -> str:
    """A prefixed token with one or two invisible characters inside it."""
    token = rng_choice(rng, ["ghp_", "sk-ant-api03-", "glpat-", "xoxb-1234567890-"]) \
        + _mixed(rng, B62, 36)
    for _ in range(rng.randint(1, 2)):
        at = rng.randrange(2, len(token) - 2)
        token = token[:at] + rng.choice(INVISIBLE) + token[at:]
    return token


def _b64_of(text: str) -> str:
    import base64

    return base64.b64encode(text.encode()).decode()


def rng_choice(rng: random.Random, options: list[str]) -> str:
    return rng.choice(options)


PREFIXES = ("", "ok so ", "Note to self: ", "FYI ", "for tomorrow's deploy: ", "",
            "Hi! quick one - ", "Reminder, ")
SUFFIXES = ("", " thanks!", "\nLet me know if it works.", " (rotating next week)", "", ".")


def _fragments(secret: str) -> tuple[str, ...]:
    """What must be gone: the secret, and for long secrets each third of it (or each body
    line of a key block); for a passphrase each pair of its words."""
    if "\n" in secret or "\\n" in secret:
        lines = [ln for ln in secret.replace("\\n", "\n").split("\n") if len(ln) >= 16
                 and not ln.startswith("-----")]
        return (secret, *lines)
    if " " in secret:
        words = secret.split()
        return (secret, *(f"{a} {b}" for a, b in itertools.pairwise(words)))
    if len(secret) >= 24:
        third = len(secret) // 3
        return (secret, secret[:third], secret[third:2 * third], secret[2 * third:])
    return (secret,)


def generate(seed: int = 7, per_kind: int = 8) -> list[Item]:
    rng = random.Random(seed)
    items: list[Item] = []
    for kind, (make, templates) in KINDS.items():
        for i in range(per_kind):
            secret = make(rng)
            template = templates[i % len(templates)]
            text = rng.choice(PREFIXES) + template.format(s=secret) + rng.choice(SUFFIXES)
            items.append(Item(kind, text, secret, _fragments(secret)))
    return items


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--per-kind", type=int, default=8)
    args = ap.parse_args(argv)
    for item in generate(args.seed, args.per_kind):
        sys.stdout.write(json.dumps({"kind": item.kind, "text": item.text,
                                     "secret": item.secret}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
