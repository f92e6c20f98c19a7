import time

from test_pynsq import error_code, loop  # noqa: F401  (the fixture)


def test_requeue_with_a_delay_is_redelivered_no_earlier(loop):
    bodies = [b"later-%02d" % i for i in range(10)]
    failing = set(bodies[::3])
    seen: dict[bytes, list] = {}
    requeued_at = {}

    def handle(message):
        now = time.monotonic()
        seen.setdefault(message.body, []).append((message.attempts, now))
        if message.body == b"async-later" and message.attempts == 1:
            message.enable_async()

            def requeue():
                requeued_at[message.body] = time.monotonic()
                message.requeue(delay=1, backoff=False)  # REQ <id> 1000
            loop.io_loop.call_later(0.05, requeue)
            return None
        if message.body in failing and message.attempts == 1:
            requeued_at[message.body] = now            # pynsq sends REQ <id> 1000 * attempts once this returns
            return False
        return True

    r = loop.reader("later", "c", handle, max_in_flight=5, requeue_delay=1, max_backoff_duration=1.0)
    loop.subscribed(r)
    w = loop.writer()
    loop.publish(w, "mpub", "later", bodies + [b"async-later"])
    loop.published(1)
    twice = failing | {b"async-later"}
    loop.run_until(lambda: all(len(seen.get(b, ())) == (2 if b in twice else 1) for b in bodies + [b"async-later"])
                   and r.backoff_timer.get_interval() == 0, what="requeued messages redelivered")
    assert loop.barrier(r) == []
    for b in twice:
        (a1, _), (a2, t2) = seen[b]
        assert (a1, a2) == (1, 2)
        assert t2 - requeued_at[b] >= 1.0, (b, t2 - requeued_at[b])


def test_msg_timeout_redelivers_and_touch_keeps_a_message_alive(loop):
    deliveries: dict[bytes, list] = {}
    held = {}

    def touch_until(message, until):
        if time.monotonic() >= until:
            message.finish()
            return
        message.touch()
        loop.io_loop.call_later(0.3, touch_until, message, until)

    def handle(message):
        now = time.monotonic()
        deliveries.setdefault(message.body, []).append((message.attempts, now))
        message.enable_async()
        if message.body == b"hold" and message.attempts == 1:
            held["hold"] = message                       # never answered: must time out
        elif message.body == b"touch":
            touch_until(message, now + 2.5)              # alive for 2.5 s on a 1 s msg_timeout
        else:
            message.finish()

    # msg_timeout is seconds in pynsq (IDENTIFY msg_timeout 1000, the minimum); output_buffer_timeout 25 ms (the
    # minimum) bounds how long a delivered frame may wait in nsqd's buffer before the client sees it.
    r = loop.reader("timeouts", "c", handle, max_in_flight=10, msg_timeout=1, output_buffer_timeout=25)
    loop.subscribed(r)
    w = loop.writer()
    t_published = time.monotonic()  # the first delivery of "hold" came after this
    loop.publish(w, "mpub", "timeouts", [b"hold", b"touch"])
    loop.published(1)
    loop.run_until(lambda: len(deliveries.get(b"hold", ())) == 2 and held["hold"].body  # redelivered
                   and next(iter(r.conns.values())).in_flight == 1,  # only the stale first "hold" is left
                   what="timeout redelivery; touched message finished")
    assert loop.barrier(r) == []   # every TOUCH and the FIN of "touch" were accepted: it never timed out
    assert [a for a, _ in deliveries[b"touch"]] == [1]
    (a1, t1), (a2, t2) = deliveries[b"hold"]
    assert (a1, a2) == (1, 2)
    # the broker delivered "hold" before this client saw it (t1), later by however long a loaded machine took; the
    # publish came before that delivery, so the timeout is bounded from below from there, whatever the lag
    assert t2 - t_published >= 1.0, (t2 - t_published, t2 - t1)
    # FIN for the first delivery of "hold", whose second delivery is finished already: E_FIN_FAILED, not fatal.
    [conn] = r.conns.values()
    held["hold"].finish()
    loop.run_until(lambda: r.errors, what="E_FIN_FAILED")
    assert [error_code(e) for e in r.errors] == [b"E_FIN_FAILED"]
    loop.publish(w, "pub", "timeouts", b"still-open")
    loop.published(2)
    loop.run_until(lambda: b"still-open" in deliveries, what="delivery after E_FIN_FAILED")
    assert r.conns == {conn.id: conn} and conn.connected()


def test_dpub_is_delivered_no_earlier_than_its_delay(loop):
    got = []

    def handle(message):
        got.append((message.body, message.attempts, time.monotonic()))
        return True

    r = loop.reader("deferred", "c", handle, max_in_flight=10)
    loop.subscribed(r)
    w = loop.writer()
    t0 = time.monotonic()
    loop.publish(w, "dpub", "deferred", 1500, b"in-1500ms")
    loop.publish(w, "dpub", "deferred", 0, b"defer-0")
    loop.publish(w, "pub", "deferred", b"now")
    loop.published(3)
    loop.run_until(lambda: len(got) == 3, what="deferred message delivered")
    assert sorted(b for b, _, _ in got[:2]) == [b"defer-0", b"now"]
    body, attempts, t = got[2]
    assert (body, attempts) == (b"in-1500ms", 1)
    assert t - t0 >= 1.5, t - t0
