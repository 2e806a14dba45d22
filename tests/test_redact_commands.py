"""Secrets redaction of credentials that commands, shells and code take apart from a
credential's name or over several lines: a key wrapped onto the lines below its name
(INI, ``~/.aws/credentials``, YAML, TOML's and Python's triple quotes), PowerShell's
``SecureString`` and credential objects, Windows' ``net use`` / ``net user`` and
``psexec``, a password piped to ``sudo -S``, a variable set by fish or csh, a setter
handed a credential's name and its value; session cookies outside a ``Cookie`` header
(``curl -b``, a ``cookies=`` dict, a cookie set by a call); and "PAT" stated as a
credential. Text about these (a person named Pat, a cookie jar's file, a switch of a
command, a preference cookie) stays as it is."""

from __future__ import annotations

import pytest

from recalld.daemon.memory.redact import MASK, redact, redact_note

HALF_A, HALF_B = "Xq9rT2vLm8PzK4nW1bYc", "Hs7DfG3jUe5RtQ0aZxVo"
PW = "Sail4Ever!x"
SESSION = "9f8e7d6c5b4a39281716f5e4d3c2b1a0"
SESSION_MIXED = "k3j4h5g6f7d8s9a0q1w2e3r4"
ADO_PAT = "4ftq7zx3mkcv2lwpb5nroyejhi6uagsdqzm7xk2wlnvc4tpfrbea"


@pytest.mark.parametrize("text", [
    f"aws_secret_access_key = {HALF_A}\n    {HALF_B}\n",
    f"[default]\naws_secret_access_key={HALF_A}\n\t{HALF_B}\nregion = eu-west-1\n",
    f"creds:\n  client_secret: {HALF_A}\n    {HALF_B}\n  host: db01\n",
    f"export AWS_SECRET_ACCESS_KEY={HALF_A}\\\n  {HALF_B}\n",
    f'aws_secret_access_key = """{HALF_A}\n{HALF_B}"""\n',
    f"token = '''{HALF_A}\n    {HALF_B}'''\n",
    f'api_key: "{HALF_A}\n  {HALF_B}"\nhost: x\n',
])
def test_a_key_wrapped_onto_the_lines_below_its_name_is_masked_whole(text: str) -> None:
    out = redact(text)
    assert HALF_A not in out and HALF_B not in out, out
    assert redact(text, keep_lines=True).count("\n") == text.count("\n")


def test_the_rest_of_a_key_below_an_earlier_mask_is_masked() -> None:
    """A note written before the pieces below a key were read as its own holds the mask,
    then the rest of the key: the index reads it again under these rules and masks that
    rest; a word below a mask, or the mask read again, stays."""
    old = f"---\nname: aws\n---\naws_secret_access_key = {MASK}\n    {HALF_B}\n"
    assert redact_note(old) == f"---\nname: aws\n---\naws_secret_access_key = {MASK}\n    {MASK}\n"
    assert redact(redact_note(old)) == redact_note(old)
    assert redact(f"password: {MASK}\n  done\n") == f"password: {MASK}\n  done\n"


def test_the_lines_after_a_wrapped_key_stay() -> None:
    """Only a piece of a key alone on a line, indented under its name, goes on: the next
    setting, a word of a list item, a paragraph after a blank line stay."""
    assert redact(f"creds:\n  secret: {HALF_A}\n  region: x\n") == (
        f"creds:\n  secret: {MASK}\n  region: x\n")
    assert redact(f"- password: {HALF_A}\n  done\n") == f"- password: {MASK}\n  done\n"
    assert redact(f"password: {HALF_A}\n\n    v2 notes\n") == f"password: {MASK}\n\n    v2 notes\n"
    assert redact(f"aws_secret_access_key = {HALF_A}\n    region = eu\n") == (
        f"aws_secret_access_key = {MASK}\n    region = eu\n")
    for text in ('description = """the password\nis rotated"""', 'password = """\n"""',
                 'password: "${DB_PASS}\n"', "token_count = 40\n    foo123"):
        assert redact(text) == text


@pytest.mark.parametrize("text", [
    f"$cred = ConvertTo-SecureString '{PW}' -AsPlainText -Force",
    f'$s = ConvertTo-SecureString -AsPlainText -Force -String "{PW}"',
    f"$s = ConvertTo-SecureString {PW} -AsPlainText -Force",
    f"$s = '{PW}' | ConvertTo-SecureString -AsPlainText -Force",
    f"$c = New-Object PSCredential('admin', '{PW}')",
    f'var c = new NetworkCredential("svc_user", "{PW}", "CORP");',
    f"(New-Object System.Net.NetworkCredential('', '{PW}')).Password",
    f'new UsernamePasswordCredentials(user, "{PW}")',
    f"net use Z: \\\\fs01\\data {PW} /user:bob",
    f"net use \\\\srv\\share '{PW}' /user:CORP\\bob",
    f"net user bob {PW} /add",
    f"psexec \\\\srv -u bob -p {PW} cmd",
    f"echo '{PW}' | sudo -S apt update",
    f"sudo -S apt update <<< '{PW}'",
    f"echo {PW} | passwd --stdin bob",
    f"set -x DB_PASSWORD {PW}",
    f"setenv DB_PASSWORD {PW}",
    f'os.Setenv("DB_PASSWORD", "{PW}")',
    f"[Environment]::SetEnvironmentVariable('DB_PASSWORD', '{PW}', 'User')",
    f"os.environ.setdefault('DB_PASSWORD', '{PW}')",
    f'config.set("db", "password", "{PW}")',
    f"[System.Net.NetworkCredential]::new('bob', '{PW}')",
    f"schtasks /create /tn backup /tr run.cmd /ru bob /rp {PW}",
    f"xfreerdp /v:srv /u:bob /p:{PW}", f"rdesktop -u bob -p {PW} srv",
    f"sqlcmd -S srv -U sa -P {PW} -Q x", f"bcp db.t out f -U sa -P{PW}",
    f"smbclient //srv/share -U bob%{PW}", f"lftp -u bob,{PW} ftp.example",
    f"ssh-keygen -t ed25519 -N '{PW}' -f key", f"gh secret set DB --body '{PW}'",
    f"setx /M DB_PASSWORD {PW}", f"elvish: set-env DB_PASSWORD {PW}",
    f"FROM alpine\nENV DB_PASSWORD {PW}\n",
])
def test_a_password_a_command_or_a_constructor_takes_is_masked(text: str) -> None:
    out = redact(text)
    assert PW not in out and MASK in out, out


@pytest.mark.parametrize("text", [
    f'props.put("db.password", "{PW}")', f"m.add('db_password', '{PW}')",
    f"FROM alpine\nENV DB_PASSWORD {PW}\n", f"isql -U sa -P {PW} -S db",
    f"osql -U sa -P {PW}", f"echo '{PW}' | passwd --stdin bob",
    f"NET\tUSE \\\\srv\\share {PW}", f"Net  User bob {PW} /add",
])
def test_a_command_password_is_masked_with_no_other_command_in_the_text(text: str) -> None:
    # Each command's pattern runs where the text holds what it cannot match without
    # (secret_commands.COMMAND_FINDERS): here nothing the other patterns need.
    out = redact(text)
    assert PW not in out and MASK in out, out


def test_powershell_code_around_the_password_stays() -> None:
    assert redact(f"$cred = ConvertTo-SecureString '{PW}' -AsPlainText -Force") == (
        f"$cred = ConvertTo-SecureString '{MASK}' -AsPlainText -Force")
    for text in ("$pass = Read-Host -AsSecureString", "$c = Get-Credential",
                 "ConvertTo-SecureString $plain -AsPlainText -Force",
                 "ConvertTo-SecureString -String $env:PW -AsPlainText -Force",
                 "$cred = New-Object PSCredential -ArgumentList $user, $secpass",
                 "keyring.get_credential('github', 'bob')",
                 "net use Z: \\\\fs01\\data /persistent:yes",
                 "net use Z: \\\\fs01\\data * /user:bob",
                 "net user bob /delete", 'net user "John Smith" /domain',
                 "psexec \\\\srv -p $pw cmd", "echo $PW | sudo -S apt update",
                 "set -x PATH $PATH /usr/local/bin", "setenv EDITOR vim",
                 "config.set('db', 'host', 'db01')", 'os.Setenv("TOKEN_TTL", "3600")',
                 "config.set('db', 'password_file', '/etc/pw')",
                 "New-PSDrive -Credential (Get-Credential) x", "ENV PATH /usr/local/bin:$PATH",
                 "ENV DB_PASSWORD_FILE /run/secrets/db", 'gh secret set X --body "$VALUE"',
                 'ssh-keygen -N "" -f key', "schtasks /create /ru SYSTEM /rp * /tn x",
                 "smbclient -U bob //srv/s", "lftp -u bob ftp.example"):
        assert redact(text) == text
    made = "New-ADUser bob -AccountPassword (ConvertTo-SecureString '{}' -AsPlainText -Force)"
    assert redact(made.format(PW)) == made.format(MASK)


@pytest.mark.parametrize(("text", "secret"), [
    (f"curl -b 'PHPSESSID={SESSION}' https://intranet.example", SESSION),
    (f"curl -s -b sessionid={SESSION_MIXED} https://x", SESSION_MIXED),
    (f'curl --cookie "theme=dark; JSESSIONID={SESSION}" https://x', SESSION),
    (f"curl -s -b 'a={SESSION_MIXED}' https://x", SESSION_MIXED),
    (f"--cookie 'b={SESSION_MIXED}'", SESSION_MIXED),
    (f"Cookie: theme=dark; PHPSESSID={SESSION}", SESSION),
    (f'document.cookie = "PHPSESSID={SESSION}; path=/";', SESSION),
    (f'requests.get(url, cookies={{"session": "{SESSION_MIXED}"}})', SESSION_MIXED),
    (f"requests.get(url, cookies={{'JSESSIONID': '{SESSION}'}})", SESSION),
    (f'requests.get(url, cookies=dict(session="{SESSION_MIXED}"))', SESSION_MIXED),
    (f'session.cookies.set("sessionid", "{SESSION_MIXED}")', SESSION_MIXED),
    (f'$s.Cookies.Add((New-Object System.Net.Cookie("PHPSESSID", "{SESSION}", "/", "x")))',
     SESSION),
    (f'page.setCookie({{name: "sid", value: "{SESSION_MIXED}"}})', SESSION_MIXED),
    (f"PHPSESSID: {SESSION}", SESSION), (f"JSESSIONID={SESSION.upper()}", SESSION.upper()),
    (f"ASP.NET_SessionId={SESSION_MIXED}", SESSION_MIXED),
    (f"the PHPSESSID is {SESSION}", SESSION), (f"my session cookie is {SESSION_MIXED}",
                                               SESSION_MIXED),
])
def test_a_session_cookie_outside_a_cookie_header_is_masked(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out and MASK in out, out


def test_cookies_that_hold_no_session_stay() -> None:
    for text in ("curl -b cookies.txt https://x", "curl -c jar.txt -b jar.txt https://x",
                 "curl -b 'theme=dark' https://x", 'curl -X POST -b "a=1; b=2" x',
                 "requests.get(u, cookies={'theme': 'dark', 'lang': 'en-US'})",
                 "resp.set_cookie('theme', 'dark')", "the cookie = a small cake",
                 "the session cookie is set on login", "PHPSESSID: none", "JSESSIONID=abc",
                 "my session cookies are stored in the browser"):
        assert redact(text) == text


@pytest.mark.parametrize("text", [
    f"my azure devops PAT is {ADO_PAT}", f"PAT for ado: {ADO_PAT}",
    f"set the PAT to {ADO_PAT}", f"use {ADO_PAT} as the PAT",
    f"PAT {ADO_PAT} expires in May", f"Pat: {ADO_PAT}",
])
def test_a_personal_access_token_stated_as_a_pat_is_masked(text: str) -> None:
    out = redact(text)
    assert ADO_PAT not in out and MASK in out, out


def test_text_about_a_person_named_pat_stays() -> None:
    for text in ("Pat is a great engineer, Pat is on call", "Pat is Bob's manager.",
                 "Pat: 555-0134", "Pat: see you at 3pm", "Pat is 4ftq7zx3mkcv2",
                 "Patrick and Pat went to the PATH variable", "the PAT expired yesterday",
                 "the PAT is stored in the vault", "Our PAT policy requires rotation"):
        assert redact(text) == text
