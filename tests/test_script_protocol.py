"""The rules the Lua scripts must hold in Lua agree with their Python definitions, and every script's
calling convention is named once: KEYS and ARGV at the top of each ``.lua``, built and read by the
codecs in ``adapters/redis/protocol*.py``, refusal codes translated by one table."""

from __future__ import annotations

import re
from importlib.resources import files
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from adapters.redis import RedisConnection, RedisInboxStore, RedisRegistry, RedisSettings
from adapters.redis.errors import REFUSALS
from adapters.redis.keys import Keys
from adapters.redis.scripts import Scripts, read_script
from broker.agent_message import AgentMessage, AgentMessageContract, Kind
from broker.envelope import Tier
from broker.errors import RelayError
from broker.ids import decode_envelope_id, encode_envelope_id, new_nonce
from broker.limits import request_hash
from broker.relay import Relay
from tests.support import address_for, unique_prefix

LUA = files("adapters.redis") / "lua"
SCRIPTS = sorted(p.name[:-4] for p in LUA.iterdir() if p.name.endswith(".lua"))
PRELUDES = {"_entry", "_session"}
COMPOSED = {"send"}

_ENVELOPE_IDS = """
local out = {}
for i = 1, #ARGV, 3 do
  local envelope = envelope_id(ARGV[i], ARGV[i + 1])
  local entry, nonce = entry_of(ARGV[i + 2])
  out[#out + 1] = {envelope, entry, nonce}
end
return out
"""

_POSITIONS = [
    (0, 0),
    (1, 1),
    (1_764_423_912_345, 0),
    (1_764_423_912_345, 7),
    (2**50 - 1, 2**30 - 1),
    (32**9, 32**5),
]


def test_lua_encodes_and_decodes_envelope_ids_as_broker_ids_does(store: redis.Redis) -> None:
    """``_entry.lua``'s ``envelope_id`` and ``entry_of`` (used where a script writes or reads a dead
    letter's envelope id) against ``broker.ids``, at the edges of the 50-bit ms and 30-bit sequence."""
    args: list[str] = []
    expected = []
    for ms, seq in _POSITIONS:
        nonce = new_nonce()
        envelope = encode_envelope_id(ms, seq, nonce)
        args += (f"{ms}-{seq}", nonce, envelope)
        expected.append([envelope, f"{ms}-{seq}", nonce])
        assert decode_envelope_id(envelope) == (ms, seq, nonce)
    reply = store.eval(read_script("_entry") + _ENVELOPE_IDS, 0, *args)  # type: ignore[no-untyped-call]
    assert reply == expected


def test_send_append_widens_tiers_in_the_order_of_broker_tiers() -> None:
    """``send_append.lua``'s rank table is ``broker.envelope.Tier``'s order (``widest``)."""
    source = (LUA / "send_append.lua").read_text(encoding="utf-8")
    table = re.search(r"local rank = \{([^}]*)\}", source)
    assert table is not None
    rank = {name: int(value) for name, value in re.findall(r"(\w+) = (\d+)", table.group(1))}
    assert rank == {tier.label: int(tier) for tier in Tier}


@pytest.mark.parametrize("name", [n for n in SCRIPTS if n not in PRELUDES | COMPOSED])
def test_each_script_names_its_keys_and_argv_once_at_the_top(name: str) -> None:
    """Outside the ``local name = KEYS[n]`` / ``ARGV[n]`` lines at its top, a script indexes KEYS and
    ARGV only by a variable (the repeated tails: id and nonce pairs, day positions)."""
    lines = (LUA / f"{name}.lua").read_text(encoding="utf-8").splitlines()
    code = [line for line in lines if not line.lstrip().startswith("--")]
    named = [
        i for i, line in enumerate(code) if re.match(r"local \w+ = (tonumber\()?(KEYS|ARGV)\[\d+\]", line)
    ]
    assert named == list(range(len(named))), f"{name}.lua: the named KEYS/ARGV are not all at the top"
    rest = "\n".join(code[len(named) :])
    assert re.search(r"(KEYS|ARGV)\[\d+\]", rest) is None, (
        f"{name}.lua indexes KEYS/ARGV by number below its top"
    )


def test_every_refusal_code_a_script_answers_is_in_the_one_table() -> None:
    answered = set()
    for name in SCRIPTS:
        source = (LUA / f"{name}.lua").read_text(encoding="utf-8")
        answered |= set(re.findall(r"error_reply\('(RELAY_[A-Z_]+)", source))
    assert answered == set(REFUSALS)


def test_every_script_loads() -> None:
    """``Scripts`` builds every file (the composed send included)."""
    scripts = Scripts()
    assert {name for name in SCRIPTS if name not in PRELUDES} == {s.name for s in scripts.all}
    assert all(getattr(scripts, s.name) is s for s in scripts.all)


def _pairs(reply: list[Any]) -> dict[str, Any]:
    """A RESP2 map (``FUNCTION LIST``): name, value, name, value, ..."""
    return dict(zip(reply[::2], reply[1::2], strict=True))


def test_the_library_loads_with_every_script_a_function_and_only_readers_flagged_no_writes(
    store: redis.Redis,
) -> None:
    """One ``FUNCTION LOAD`` registers every script under its ``Script.function`` name; a ``no-writes``
    function calls no write command (Redis would refuse it when it ran), directly or through a prelude."""
    scripts = Scripts()
    store.function_load(scripts.library.source, replace=True)  # the one relay's tests load anyway
    (listed,) = [_pairs(entry) for entry in store.function_list(library=scripts.library.name)]
    flags = {f["name"]: set(f["flags"]) for f in map(_pairs, listed["functions"])}
    assert set(flags) == {s.function for s in scripts.all}
    writes = re.compile(r"redis\.p?call\('(?!(XRANGE|XPENDING|HGET|HMGET|HGETALL|XLEN|TIME)')")
    preludes = "".join((LUA / f"{name}.lua").read_text(encoding="utf-8") for name in PRELUDES)
    helpers = dict(re.findall(r"^local function (\w+)\(.*?\n(.*?)^end$", preludes, re.M | re.S))
    for script in scripts.all:
        if "no-writes" in flags[script.function]:
            body = (LUA / f"{script.name}.lua").read_text(encoding="utf-8")
            used = [helpers[name] for name in helpers if re.search(rf"\b{name}\(", body)]
            assert not writes.search(body), script.name
            assert not any(writes.search(code) for code in used), script.name


class _TwoSteps(RedisConnection):
    """A connection to one Redis that sends as on a cluster: ``send_check``, ``send_append``, then
    ``send_refund`` or ``send_note`` as separate calls (``RedisInboxStore._two_steps``)."""

    @property
    def single_node(self) -> bool:
        return False


async def _undo_story(redis_url: str, connection_type: type[RedisConnection]) -> list[object]:
    """A refused send, a repeat whose first attempt never landed, and a send that proves the token came
    back: what each answered, and what the store holds after each."""
    prefix = unique_prefix()
    settings = RedisSettings(url=redis_url, prefix=prefix, inbox_cap=1, send_rate=0.001, send_burst=2)
    connection, keys = connection_type(settings), Keys(prefix)
    contract = AgentMessageContract()
    relay = Relay(contract, RedisInboxStore(connection), RedisRegistry(connection))
    body = AgentMessage(kind=Kind.KIND_REQUEST, text="undo me")
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    story: list[object] = []

    async def facts() -> list[object]:
        tokens = await client.hget(keys.rate("alice"), "tokens")
        claims = [await client.exists(keys.idempotency_claim("alice", k)) for k in ("k1", "k2", "k3")]
        depth = [await client.xlen(keys.inbox(agent)) for agent in ("bob", "carol", "dave")]
        return [int(float(tokens)) if tokens else None, claims, depth]

    async def send(to: str, key: str) -> str:
        try:
            sent = await relay.send("alice", to, body, idempotency_key=key)
        except RelayError as exc:
            return exc.code
        return str([s.state for s in await relay.status("alice", [sent.id])])

    try:
        async with relay:
            for agent in ("alice", "bob", "carol", "dave"):
                await relay.register(agent, address_for(Tier.HOST, agent), f"s-{agent}")
            story += [await send("bob", "k1"), await facts()]
            story += [await send("bob", "k2"), await facts()]  # bob's inbox is full: step 2 refuses
            await client.set(
                keys.idempotency_claim("alice", "k3"),
                request_hash("carol", contract.to_fields(body), None),
                px=60_000,
            )  # a first attempt claimed k3 and its worker died before step 2
            story += [await send("carol", "k3"), await facts()]
            story += [await send("dave", "k4"), await facts()]  # the refunded token, spent
            story += [await send("dave", "k5"), await facts()]  # none left
        await connection.open()
        try:
            await connection.delete_prefix()
        finally:
            await connection.close()
    finally:
        await client.aclose()
    return story


async def test_a_send_undoes_and_notes_the_same_in_one_call_as_in_two_steps(redis_url: str) -> None:
    """The undo of a refused send and the note of a repeat that landed late are decided twice, by
    ``send.lua`` (one Redis) and by ``RedisInboxStore._two_steps`` (a cluster): run both on the same
    story and compare what they answered and left in the store."""
    one_call = await _undo_story(redis_url, RedisConnection)
    assert one_call == await _undo_story(redis_url, _TwoSteps)
    assert one_call[::2] == ["['queued']", "inbox_full", "['queued']", "['queued']", "rate_limited"]
    assert one_call[3] == [1, [1, 0, 0], [1, 0, 0]]  # the token and the claim of k2 given back
