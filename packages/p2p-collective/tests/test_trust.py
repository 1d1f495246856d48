"""The trust model: object policy ``plain``, the job token at rendezvous, bind addresses."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
import trust_tasks as tt
from conftest import make_store

from p2p_asyncwork import ConfigError
from p2p_collective import (
    AuthenticationError,
    Collective,
    CollectiveConfig,
    CollectiveError,
    ObjectRefusedError,
    parse_collective_config,
)
from p2p_collective._frames._plain import load_object, load_object_lenient
from p2p_collective._peers._auth import TOKEN_ENV, JobAuth, token_key

pytestmark = pytest.mark.timeout(300)

ALLOW = ("trust_tasks:Allowed",)


# -- the restricted unpickler ----------------------------------------------------------------


def dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


@pytest.mark.parametrize("value", tt.plain_values()[:5], ids=lambda v: type(v).__name__)
def test_plain_accepts_plain_data(value: Any) -> None:
    assert load_object(dumps(value), "plain") == value


def test_plain_accepts_every_supported_dtype_and_allowlisted_dataclass() -> None:
    from p2p_collective._frames._framing import DTYPE_TO_CODE

    dtypes = list(DTYPE_TO_CODE)
    assert load_object(dumps(dtypes), "plain") == dtypes
    skeleton = tt.Allowed(None, 4, note="n")  # type: ignore[arg-type]
    assert load_object(dumps(skeleton), "plain", ALLOW) == skeleton


def test_plain_refuses_code_without_running_it(tmp_path: Path) -> None:
    target = tmp_path / "ran"
    with pytest.raises(ObjectRefusedError) as info:
        load_object(dumps(tt.Evil(str(target))), "plain", ALLOW)
    assert "'posix.mkdir'" in str(info.value)
    assert "object_policy 'plain'" in str(info.value)
    assert not target.exists()
    # the default policy does run it: that is what the option is for
    load_object(dumps(tt.Evil(str(target))), "pickle")
    assert target.is_dir()


@pytest.mark.parametrize(
    ("value", "name"),
    [
        (tt.NotAllowed(torch.ones(1), 1), "'trust_tasks.NotAllowed'"),
        ({"x": torch.ones(1)}, "'torch._utils._rebuild_tensor_v2'"),
        (range(3), "'builtins.range'"),
        (print, "'builtins.print'"),
    ],
)
def test_plain_refuses_other_globals_by_name(value: Any, name: str) -> None:
    with pytest.raises(ObjectRefusedError, match=name):
        load_object(dumps(value), "plain", ALLOW)


def test_allowlisting_a_non_dataclass_or_a_missing_class_is_refused() -> None:
    with pytest.raises(ObjectRefusedError, match="is not a dataclass"):
        load_object(dumps(tt.Evil("/nonexistent/x").__class__), "plain", ("trust_tasks:Evil",))
    fake = dumps(tt.Allowed(None, 1)).replace(b"Allowed", b"Missing")  # type: ignore[arg-type]
    with pytest.raises(ObjectRefusedError, match="cannot be imported here"):
        load_object(fake, "plain", ("trust_tasks:Missing",))


def test_old_protocols_and_crafted_opcodes_are_refused_too(tmp_path: Path) -> None:
    target = tmp_path / "ran"
    for protocol in range(0, pickle.HIGHEST_PROTOCOL + 1):
        data = pickle.dumps(tt.Evil(str(target)), protocol=protocol)
        with pytest.raises(ObjectRefusedError):
            load_object(data, "plain")
    # GLOBAL + REDUCE written by hand, and an INST opcode
    with pytest.raises(ObjectRefusedError, match=r"'os\.system'"):
        load_object(b"cos\nsystem\n(S'true'\ntR.", "plain")
    with pytest.raises(ObjectRefusedError, match=r"'os\.system'"):
        load_object(b"(S'true'\nios\nsystem\n.", "plain")
    with pytest.raises(ObjectRefusedError, match="persistent"):
        load_object(b"P1\n.", "plain")
    assert not target.exists()


def test_lenient_load_reads_to_the_end_and_names_every_refusal(tmp_path: Path) -> None:
    target = tmp_path / "ran"
    meta = (5, [tt.Evil(str(target)), "k"], [(torch.float32, (2,), False)], tt.Allowed)
    decoded, refused = load_object_lenient(dumps(meta), "plain")
    assert refused == ["posix.mkdir", "trust_tasks.Allowed"]
    assert decoded[2] == [(torch.float32, (2,), False)]
    assert decoded[1][1] == "k"
    assert not target.exists()
    assert load_object_lenient(dumps({"a": 1}), "plain") == ({"a": 1}, [])


# -- config -------------------------------------------------------------------------------------


def test_config_allowlist_parses_and_round_trips() -> None:
    cfg = parse_collective_config({"object_policy": "plain", "object_allowlist": list(ALLOW)})
    assert cfg.object_allowlist == ALLOW
    assert parse_collective_config(cfg.to_dict()) == cfg
    direct = CollectiveConfig(object_policy="plain", object_allowlist=["a.b:C.D"])  # type: ignore[arg-type]
    assert direct.object_allowlist == ("a.b:C.D",)


@pytest.mark.parametrize(
    ("section", "path", "words"),
    [
        ({"object_allowlist": ["a:B"]}, "cluster.collective.object_allowlist", "restricts nothing"),
        ({"object_policy": "plain", "object_allowlist": "a:B"}, "object_allowlist", "a list"),
        ({"object_policy": "plain", "object_allowlist": ["a.B"]}, "object_allowlist[0]", "a.B"),
        ({"object_policy": "plain", "object_allowlist": [None]}, "object_allowlist[0]", "None"),
        ({"object_policy": "plain", "object_allowlist": ["a:1x"]}, "object_allowlist[0]", "1x"),
        ({"object_policy": "yaml"}, "object_policy", "'pickle' or 'plain'"),
    ],
)
def test_config_errors_name_the_key(section: dict[str, Any], path: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_collective_config(section)
    assert path in str(info.value)
    assert words in str(info.value)


# -- errors and token handling ------------------------------------------------------------------


@pytest.mark.parametrize("cls", [ObjectRefusedError, AuthenticationError])
def test_errors_pickle_with_message_and_cause(cls: type[CollectiveError]) -> None:
    err = cls("refused 'os.system'")
    err.__cause__ = ValueError("why")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert isinstance(back, CollectiveError)
    assert str(back) == "refused 'os.system'"
    assert isinstance(back.__cause__, ValueError)
    assert str(back.__cause__) == "why"


def test_token_argument_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from p2p_collective._peers._auth import FROM_ENV

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert token_key(FROM_ENV) is None
    monkeypatch.setenv(TOKEN_ENV, "")
    assert token_key(FROM_ENV) is None
    monkeypatch.setenv(TOKEN_ENV, "s3cret")
    assert token_key(FROM_ENV) == b"s3cret"
    assert token_key(None) is None
    assert token_key(b"\x00k") == b"\x00k"
    with pytest.raises(ValueError, match="job_token"):
        token_key("")
    with pytest.raises(TypeError, match="job_token"):
        token_key(5)
    with pytest.raises(TypeError, match="job_token"):
        Collective("a", make_store(), job_token=5)  # type: ignore[arg-type]
    auth = JobAuth(b"s3cret")
    assert "s3cret" not in repr(auth)
    with pytest.raises(TypeError, match="never pickled"):
        pickle.dumps(auth)


# -- real processes ------------------------------------------------------------------------------


def test_plain_policy_refuses_objects_and_the_group_keeps_working(tmp_path: Path) -> None:
    store = make_store()
    evil = str(tmp_path / "ran")
    sent, got = tt.run_ranks(
        tt.policy_pair, store.port, [("policy", evil), ("policy", evil)], timeout=240
    )
    assert sent == "done"
    n_plain = len(tt.plain_values())
    assert [s for s, _ in got[:n_plain]] == ["ok"] * n_plain
    assert got[n_plain][0] == "ok"
    assert "Allowed(weights=tensor([0, 1, 2]), step=5" in got[n_plain][1]
    refused = got[n_plain + 1 : n_plain + 4]
    assert [s for s, _ in refused] == ["ObjectRefusedError"] * 3
    assert "'trust_tasks.NotAllowed'" in refused[0][1]
    assert "'posix.mkdir'" in refused[1][1]
    assert "'p2p_collective._frames._tensor_pickle.rebuild'" in refused[2][1]
    for _, message in refused:
        assert message.startswith("p2p[policy]: refused a ")
        assert "from 'sender'" in message
        assert "object_policy 'plain'" in message
    assert got[-2:] == [("ok", "'still in step'"), ("ok", "{'after': tensor([0, 1, 2, 3, 4])}")]
    assert not Path(evil).exists()


def test_plain_policy_in_an_n_member_broadcast(tmp_path: Path) -> None:
    store = make_store()
    evil = str(tmp_path / "ran")
    out = tt.run_ranks(tt.policy_multi, store.port, [("bc", evil)] * 3, timeout=240)
    src, *receivers = out
    assert [s for s, _ in src[:6]] == ["ok"] * 6  # the source never decodes
    for got in receivers:
        assert got[0] == ("ok", "{'step': 1, 'shape': torch.Size([2])}")
        assert [s for s, _ in got[1:4]] == ["ObjectRefusedError"] * 3
        assert "'posix.mkdir'" in got[1][1]
        assert "coll[coll:bc]" in got[1][1]
        assert "'trust_tasks.NotAllowed'" in got[2][1]
        assert "'posix.mkdir'" in got[3][1]
        assert got[4] == ("ok", "{'w': tensor([1., 1., 1.])}")
        assert got[5] == ("ok", "'after'")
    for got in out:
        assert got[6] == ("allreduce", [6.0, 6.0])
    assert not Path(evil).exists()


def test_job_token_lets_only_holders_join_and_never_enters_the_store() -> None:
    store = make_store()
    secret = "job-secret-" + "x" * 40
    cases = [
        ("same", secret, secret),
        ("wrong", secret, "another-jobs-token"),
        ("a-none", secret, None),
        ("b-none", None, secret),
        ("no-token", None, None),
        ("env", "env", secret),  # rank 0 reads $P2P_JOB_TOKEN
    ]
    a, b = tt.run_ranks(tt.token_pair, store.port, [(cases, secret), (cases, None)], timeout=240)
    assert a[0] == ("ok", None)
    assert b[0] == ("ok", "hi same")
    for i, name in [(1, "wrong"), (2, "a-none"), (3, "b-none")]:
        for side, peer in ((a[i], "tok-b"), (b[i], "tok-a")):
            assert side[0] == "AuthenticationError", (name, side)
            assert f"p2p/{name}/" in side[1]
            assert f"peer {peer!r}" in side[1]
            assert secret not in side[1]
            assert "another-jobs-token" not in side[1]
    assert "does not hold this job's token" in a[1][1]
    assert "does not hold" in b[1][1]
    assert "presented no job token" in a[2][1]
    assert "holds none" in b[2][1]
    assert "holds none" in a[3][1]
    assert "presented no job token" in b[3][1]
    assert a[4] == ("ok", None)
    assert b[4] == ("ok", "hi no-token")
    assert a[5] == ("ok", None)
    assert b[5] == ("ok", "hi env")
    keys = store.list_keys()
    assert any("/auth/" in k for k in keys)
    blob = b"\n".join(k.encode() + b"=" + bytes(store.get(k)) for k in keys)
    assert secret.encode() not in blob
    assert b"another-jobs-token" not in blob


def test_job_token_in_an_n_member_group() -> None:
    store = make_store()
    good = [tt.token_multi, store.port]
    ok = tt.run_ranks(*good, [(["k", "k", "k"], "all")] * 3, timeout=240)  # type: ignore[arg-type]
    assert ok == [("ok", [3.0, 3.0])] * 3
    bad = tt.run_ranks(*good, [(["k", "k", "z"], "bad")] * 3, timeout=240)  # type: ignore[arg-type]
    for rank, (status, message) in enumerate(bad):
        assert status == "AuthenticationError", (rank, message)
        assert "coll[coll:bad]" in message
        assert ("'t2'" in message) if rank < 2 else ("'t0'" in message or "'t1'" in message)


def test_no_listener_binds_a_wildcard_address() -> None:
    store = make_store()
    found = tt.run_ranks(tt.listeners, store.port, [("lst",)] * 3, timeout=240)
    for rank, socks in enumerate(found):
        assert socks, f"rank {rank} has no listening socket (gloo listens on its device)"
        for ip, port in socks:
            assert ip not in ("0.0.0.0", "0000:0000:0000:0000:0000:0000:0000:0000"), (rank, port)
            assert ip == "127.0.0.1", (rank, ip, port)
