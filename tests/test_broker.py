"""ChunkBroker (vlaperf.serve.broker) against a scripted client: which action each control step gets, what each
request carries, switches, stalls and refused calls. No server: the client's replies are released by the test."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from vlaperf.serve.broker import ChunkBroker
from vlaperf.serve.client import ServerError

H = 8


class ScriptedClient:
    """Call k answers the chunk 100 k + (0..H-1) (one action dim); calls after the first wait for `release`."""

    def __init__(self, fail=()):
        self.requests, self.fail = [], set(fail)
        self.release = threading.Event()

    def infer(self, obs):
        k = len(self.requests)
        self.requests.append(obs)
        if k > 0:
            assert self.release.wait(10)
            self.release.clear()
        if k in self.fail:
            raise ServerError({"error": "InputError", "message": f"call {k} refused"})
        reply = {"actions": (100.0 * k + np.arange(H, dtype=np.float32))[:, None], "server_timing": {"infer_ms": 1.0}}
        if "rtc/executed" in obs:
            reply["rtc"] = {"guided": True}
        return reply


def until(condition, timeout_s=10.0):
    """Wait for the broker's thread: a call it sent reaches the client on that thread."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def answer(broker, client):
    """Let the call in flight return, and wait until it has."""
    client.release.set()
    broker._pending[0].result(timeout=10)


def test_the_next_chunk_takes_over_at_the_step_it_was_asked_for_from():
    client = ScriptedClient()
    broker = ChunkBroker(client, control_hz=10.0, replan_every=3, rtc=True)
    got = [float(broker.act({"step": s})[0]) for s in range(3)]
    assert got == [0, 1, 2] and len(client.requests) == 1  # the first chunk, asked for and waited on
    assert float(broker.act({"step": 3})[0]) == 3  # 3 handed out: the next chunk asked for, this step's obs sent
    # the delay: the last round trip (the first call's, well under the 0.1 s period) in steps, rounded up
    until(lambda: len(client.requests) == 2)
    assert client.requests[1] == {"step": 3, "rtc/executed": 3, "rtc/delay": 1}
    assert float(broker.act({"step": 4})[0]) == 4  # still running while the call is in flight
    answer(broker, client)
    # sent at step 3, arrives for step 5: the new chunk's actions 0 and 1 stand for steps 3 and 4, gone
    assert float(broker.act({"step": 5})[0]) == 102
    st = broker.stats
    # two steps gone against a declared delay of 1: late
    assert (st.switches, st.guided_switches, st.late_switches, st.stalls, st.errors) == (1, 1, 1, 0, 0)
    assert st.jumps == [pytest.approx(abs(102 - 5))]  # new chunk's step-5 action against the old one's
    assert len(st.call_ms) == 2 and st.infer_ms == [1.0, 1.0]


def test_a_chunk_that_runs_out_stalls_until_the_reply():
    client = ScriptedClient()
    broker = ChunkBroker(client, control_hz=100.0, replan_every=6, round_trip_s=0.0)
    for s in range(H):
        broker.act({"step": s})  # the call is asked for at step 6 and not answered
    until(lambda: len(client.requests) == 2)
    assert "rtc/executed" not in client.requests[1]  # rtc=False: a plain request
    threading.Timer(0.05, client.release.set).start()
    assert float(broker.act({"step": H})[0]) == 100 + 2  # waited; sent at step 6, two steps gone
    st = broker.stats
    assert st.stalls == 1 and st.wait_s >= 0.04 and st.late_switches == 1  # declared delay 1, 2 steps gone


def test_a_refused_call_keeps_the_running_chunk_and_a_refused_first_call_raises():
    client = ScriptedClient(fail={1})
    broker = ChunkBroker(client, control_hz=10.0, replan_every=2, round_trip_s=0.0)
    broker.act({}), broker.act({}), broker.act({})
    answer(broker, client)
    assert float(broker.act({})[0]) == 3 and broker.stats.errors == 1  # call 1 refused: the first chunk goes on
    assert broker._pending is not None  # and the next one is asked for at once
    client.release.set()
    broker.reset()  # waits for call 2, discards it
    client.fail = {3}
    client.release.set()
    with pytest.raises(ServerError, match="call 3 refused"):
        broker.act({})  # nothing to run yet: the caller hears of it
    assert broker.stats.errors == 1
    client.release.set()
    assert float(broker.act({})[0]) == 400  # the next step asks again: an episode's first chunk


def test_reset_starts_an_unguided_episode_and_bad_settings_are_named():
    client = ScriptedClient()
    with ChunkBroker(client, control_hz=10.0, replan_every=1, rtc=True) as broker:
        broker.act({}), broker.act({})
        client.release.set()
        broker.reset()
        assert broker.stats.switches == 0 and broker.stats.call_ms == []
        client.release.set()
        broker.act({"after": 1})  # on this thread: the episode's first call is waited for
        assert client.requests[-1] == {"after": 1}  # and carries no rtc keys
        client.release.set()
    with pytest.raises(ValueError, match="control_hz: expected a finite number > 0, got 0"):
        ChunkBroker(client, control_hz=0, replan_every=1)
    with pytest.raises(ValueError, match="replan_every: expected an integer >= 1, got 0"):
        ChunkBroker(client, control_hz=10.0, replan_every=0)


def test_ctrl_c_leaves_the_broker_without_waiting_for_the_call_in_flight():
    """A KeyboardInterrupt out of the broker's `with` does not wait for a call still in flight (against a server
    that hangs it waited until the client gave up: 44 s after Ctrl-C in `vlaperf rollout --async`)."""
    client = ScriptedClient()
    timer = threading.Timer(5.0, client.release.set)  # the hung server's reply, long after the Ctrl-C
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            with ChunkBroker(client, control_hz=10.0, replan_every=1) as broker:
                broker.act({}), broker.act({})  # the second step's call is in flight, unanswered
                until(lambda: len(client.requests) == 2)
                raise KeyboardInterrupt
        assert time.monotonic() - t0 < 2.5
    finally:
        timer.cancel()
        client.release.set()


def test_a_synchronous_broker_waits_for_each_chunk_and_records_its_switches():
    client = ScriptedClient()
    client.release.set()
    broker = ChunkBroker(client, control_hz=10.0, replan_every=3, asynchronous=False)
    got = []
    for s in range(7):
        if s in (3, 6):
            client.release.set()  # the call of this step is answered before `act` returns
        got.append(float(broker.act({"step": s})[0]))
    assert got == [0, 1, 2, 100, 101, 102, 200]  # each new chunk from its start, at steps 3 and 6
    assert [r["step"] for r in client.requests] == [0, 3, 6]
    st = broker.stats
    assert st.switches == 2 and st.jumps == [pytest.approx(97), pytest.approx(97)] and st.stalls == 0
    with pytest.raises(ValueError, match="rtc: real-time chunking guides a chunk computed while the robot moves"):
        ChunkBroker(client, control_hz=10.0, replan_every=3, rtc=True, asynchronous=False)


def test_call_split_places_the_round_trip_and_the_ways_there_and_back_on_one_clock():
    from vlaperf.serve.broker import SPLIT_KEYS, call_split

    timing = {"infer_ms": 10.0, "queue_ms": 0.5, "handoff_ms": 0.25, "server_ms": 11.0, "received_at_s": 100.0012}
    infer, split = call_split({"server_timing": timing}, 13.0, sent_at_s=100.0, pack_ms=0.3, unpack_ms=0.1)
    assert infer == 10.0 and set(split) == set(SPLIT_KEYS)
    assert split["client_pack_ms"] == 0.3 and split["client_unpack_ms"] == 0.1  # the client's own, as given
    assert split["front_end_ms"] == pytest.approx(2.5) and split["server_handoff_ms"] == 0.25
    assert split["client_side_ms"] == pytest.approx(2.0)  # the round trip less the server's received-to-built time
    assert split["uplink_ms"] == pytest.approx(1.2) and split["downlink_ms"] == pytest.approx(0.8)
    assert np.isnan(split["keep_warm_wait_ms"])  # a server without keep-warm says nothing of it
    _, split = call_split({"server_timing": dict(timing, keep_warm_wait_ms=0.4)}, 13.0)
    assert split["keep_warm_wait_ms"] == 0.4  # of the queue's 0.5 ms, 0.4 behind a keep-warm run
    # no send time, an older server (no received_at_s), or clocks that are not one (a server elsewhere): no ways
    for reply, sent in (({"server_timing": timing}, None),
                        ({"server_timing": {k: v for k, v in timing.items() if k != "received_at_s"}}, 100.0),
                        ({"server_timing": timing}, 100.5),  # received before it was sent
                        ({"server_timing": timing}, 99.0)):  # an uplink longer than all that is outside the server
        _, split = call_split(reply, 13.0, sent_at_s=sent)
        assert np.isnan(split["uplink_ms"]) and np.isnan(split["downlink_ms"])
        assert np.isnan(split["client_pack_ms"]) and np.isnan(split["client_unpack_ms"])  # none given
        assert split["client_side_ms"] == pytest.approx(2.0 if "server_ms" in reply["server_timing"] else np.nan,
                                                        nan_ok=True)
    # a server from before session 51's end: only the first two pieces
    _, split = call_split({"server_timing": {"infer_ms": 10.0, "queue_ms": 0.5}}, 13.0, sent_at_s=100.0)
    assert split["front_end_ms"] == pytest.approx(2.5)
    assert all(np.isnan(split[k]) for k in ("server_handoff_ms", "client_side_ms", "uplink_ms", "downlink_ms"))


def test_the_broker_records_each_answered_calls_ways_there_and_back():
    class StampingClient(ScriptedClient):
        """Replies as a server on this host would: received 0.2 ms after the send, 1 ms in the server; says its own
        packing and unpacking as vlaperf's Client does."""

        def infer(self, obs):
            t_received = time.perf_counter() + 0.0002
            reply = super().infer(obs)
            reply["server_timing"].update(server_ms=1.0, handoff_ms=0.1, queue_ms=0.0, received_at_s=t_received)
            time.sleep(0.002)
            self.last_pack_ms, self.last_unpack_ms = 0.05 * len(self.requests), 0.01
            return reply

    client = StampingClient()
    client.release.set()
    broker = ChunkBroker(client, control_hz=10.0, replan_every=3, asynchronous=False)
    for s in range(4):
        client.release.set()
        broker.act({"step": s})
    st = broker.stats
    assert len(st.split["uplink_ms"]) == len(st.call_ms) == 2
    for up, down, outside in zip(st.split["uplink_ms"], st.split["downlink_ms"], st.split["client_side_ms"]):
        assert 0.2 <= up and down > 0 and up + down == pytest.approx(outside)  # a NaN (no split) fails here
    assert st.split["client_pack_ms"] == [0.05, 0.1] and st.split["client_unpack_ms"] == [0.01, 0.01]  # each call's
    # a client that does not say its own pieces (openpi's, the scripted one): NaN, which the rollout leaves out
    plain = ChunkBroker(ScriptedClient(), control_hz=10.0, replan_every=3, asynchronous=False)
    plain.act({"step": 0})
    assert np.isnan(plain.stats.split["client_pack_ms"][0]) and np.isnan(plain.stats.split["uplink_ms"][0])


def test_a_chunk_asked_for_as_it_runs_out_stalls_for_it_at_that_step():
    """replan_every = the chunk's length (or a reply shorter than replan_every): the next chunk is asked for at the
    step the running one has no action left for. That step waits for the reply, a stall, and executes the new
    chunk's first action. It handed out the old chunk's last action again instead, counted no stall, and the
    switch one step later skipped the new chunk's first action and read as late (declared delay 0, a step gone)."""
    client = ScriptedClient()
    broker = ChunkBroker(client, control_hz=100.0, replan_every=H, round_trip_s=0.0)
    got = [float(broker.act({"step": s})[0]) for s in range(H)]
    assert got == list(range(H)) and len(client.requests) == 1
    threading.Timer(0.05, client.release.set).start()
    assert float(broker.act({"step": H})[0]) == 100  # asked for now, waited for: the new chunk from its start
    assert client.requests[1] == {"step": H}
    st = broker.stats
    assert (st.stalls, st.switches, st.late_switches) == (1, 1, 0) and st.wait_s >= 0.04
    assert st.jumps == []  # the old chunk had no action for this step: no jump to measure
    assert float(broker.act({"step": H + 1})[0]) == 101 and len(client.requests) == 2
