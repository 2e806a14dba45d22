"""map_exceptions: domain errors leave the RPC boundary as their wire errors."""

from __future__ import annotations

import pytest

from recalld.daemon.errors import map_exceptions
from recalld.daemon.providers.errors import ProviderError
from recalld.daemon.store.errors import StorageError
from recalld.ipc.errors import InternalError, InvalidParams, ProviderUnavailable


def test_domain_errors_become_wire_errors_with_their_cause() -> None:
    for domain, wire in ((StorageError("disk says no", "/x"), InternalError),
                         (ProviderError("upstream 503"), ProviderUnavailable)):
        with pytest.raises(wire) as caught, map_exceptions():
            raise domain
        assert caught.value.__cause__ is domain
        assert caught.value.message == domain.message


def test_wire_and_other_errors_pass_unchanged() -> None:
    bad = InvalidParams("param 'x' must be a string")
    with pytest.raises(InvalidParams) as caught, map_exceptions():
        raise bad
    assert caught.value is bad
    with pytest.raises(KeyError), map_exceptions():
        raise KeyError("k")
    with map_exceptions():
        pass  # nothing raised: nothing happens
