"""The compiled lane's shared words, described once: every block of int64 words that the pump
(``workers/lane/pump.py``), the forward lane (``fastlane.py``), the own path (``ownpath.py``) and their Python sides
hand each other, with each word's offset, what it holds, who writes it and who reads it. Every module of the lane
imports its offsets from here; nothing else defines them.

These blocks are process-local numpy arrays (not shared memory between processes): "shared" means shared between
Python and the compiled calls, and between the kernels of one call. Each word has one writer at a time, and the
caller and a kernel never run at once, so plain loads and stores are enough. numba compiles ``a[NAME]`` with a
module constant ``NAME`` to the same load as a scalar argument's, so a block costs the hot path nothing but saves
unboxing an argument per word at every call from Python.

Blocks (shape, dtype; writer -> readers):

``st``: the staged messages, ``(ST_ROWS, MAX_STAGED)`` int64, one column per staged message.
    Writer: ``pump._read`` (one column per message of a lone PUB or MPUB it recognised). Readers: ``Pump.commit``
    and ``_settle_and_send`` (the OKs), ``fastlane.forward_staged`` / ``_lane_commands``, ``ownpath.own_publish``,
    ``OwnPath.done``.
    ST_FD      the producer's socket            ST_GEN   its fd generation at the read (an OK for a closed fd is
    ST_TOPIC   pump topic id                             never sent: ``Pump.gen``)
    ST_OFF     body offset in the read buffer   ST_LEN   body length
    ST_N       messages in its command (1: a PUB or an MPUB of one)
    ST_LAST    1 on the last message of its command (where the OK goes)
    ST_SENT    written by ``_settle_and_send``, read by ``Pump.settled``: what became of its OK (the frame's size:
               sent, or none due; -1: output queued, -2: connection gone, -3: refused, -4: parked; less than the
               frame: partly sent)

``out``: the reads for Python, ``(OUT_ROWS, MAX_EVENTS)`` int64, one column per read the pump did not stage.
    Writer: ``pump._read``; ``ownpath.own_fin`` takes a lone FIN's (``counts[CN_OTHER]`` back to 0). Reader:
    ``Pump.after_read``.
    OUT_FD     the socket       OUT_KIND  DATA (bytes for the session's parser) or CLOSED (end of stream, error)
    OUT_OFF    offset of the bytes in the read buffer   OUT_LEN  their length

``counts``: one read's totals, ``(COUNTS,)`` int64. Writer: ``pump._read`` (the lane clears CN_STAGED after it
    published or forwarded them, ``own_fin`` CN_OTHER after it took a FIN). Readers: ``Pump.after_read``,
    ``Pump.commit``, ``fastlane.serve``, ``own_fin``.
    CN_STAGED  columns of ``st`` filled   CN_OTHER  columns of ``out`` filled
    CN_TOPICS  1 when the staged messages are for more than one topic (commit groups them)

``res``: the outcome of one ``fastlane.serve`` call, ``(RES_WORDS,)`` int64. Writer: ``serve``. Reader:
    ``FastLane._serve``.
    RES_CODE     R_EVENTS, R_READ, R_SETTLED, R_TIMEOUT, R_OWN or R_DRAINED (``fastlane``'s docstring)
    RES_EVENTS   with R_EVENTS: epoll events in the lane's event buffer
    RES_TALLIES, RES_ATTENTION, RES_MOVERS   with R_SETTLED / R_OWN: what ``_settle_and_send`` returned (tallies
                 to fold, OKs Python must answer, producers to move)
    RES_STAGED   with R_SETTLED / R_OWN: the staged messages that call answered
    RES_FORWARDS forwards the call committed (always)
    RES_DRAINED  with R_DRAINED: messages ``own_drain`` took from the input rings (their lengths at DR_LEN)

``ow``: the own path's words, ``(OW_WORDS,)`` int64 (``ownpath``'s docstring).
    Head, written by ``OwnPath.arm`` before each lane call (OW_TICK, OW_SEQ, OW_FINS also by the kernels):
    OW_ARMED        1 when a topic is armed (0: the lane does no own publish or FIN)
    OW_T            the armed topic's pump id          OW_NODE, OW_TICK, OW_SEQ  its ID generator's state
                    (``own_publish`` advances TICK and SEQ; ``OwnPath.done`` copies them back)
    OW_ROWS         rows armed (<= MAX_ROWS)           OW_TOPIC_INDEX  the topic's index (in-flight slots name it)
    OW_WBASE        the worker's suspect words' base (``workers/storage/poison.py``)
    OW_FINS         FINs the lane took (``own_fin`` counts up; ``OwnPath.fins_done`` reads and clears it)
    MAX_ROWS rows of ROW words from ROWS_AT, one per armed channel: written by ``arm`` (RW_CH .. RW_TIMEOUT,
    RW_FINS, RW_TTL), ``own_publish`` (RW_GOT .. RW_DEADLINE), ``own_fin`` (RW_FREE += 1); read by the kernels and
    ``OwnPath.done`` / ``fins_done``:
    RW_CH, RW_KEY   the channel's log slot and key     RW_CONN, RW_FD  its consumer's connection id and socket
    RW_FREE         the consumer's free RDY (0 or less: the row is armed for its FINs only)
    RW_TIMEOUT      its message timeout, ns            RW_FINS  1 when the lane may take its FINs
    RW_TTL          the channel's message TTL, ns (0: none; the round's RD_TTL_CUTOFF is the read's time minus it)
    RW_GOT, RW_END, RW_SENT, RW_DEADLINE   the row's round: messages delivered, end of its frames in the round
                    buffer, bytes of them sent, the round's deadline
    Scratch of ``own_publish``: A_TS, A_IDS, A_NB (MAX_N each: the append's timestamps, IDs, not-befores; A_POS
    an empty slice), READ_AT (7 x MAX_N: the delivery rounds' read columns, shared by the rows), SLOTS_AT
    (MAX_ROWS x MAX_N: each row's in-flight slots, read by ``done``).
    The FINs the lane took, written by ``own_fin``, read by ``fins_done``: FN_ROW, FN_SLOT (MAX_FINS each: the
    row and the freed slot of each); FN_ID, FN_STATUS, FN_FREED (one FIN's scratch).
    RD_AT: ROUND_WORDS of ``own_publish``'s, the round words (``rd``, below) of the row it delivers to.
    DR_OFF, DR_LEN (MAX_N each): the bodies ``own_drain`` took from the input rings, as offsets into the rings'
    buffer and lengths (``OwnPath.done`` reads the lengths).
"""

MAX_EVENTS = 1024           # epoll events per wait; also the columns of ``out``
MAX_STAGED = 8192           # messages one read call may stage (columns of ``st``)

# st: the staged messages (rows)
ST_FD, ST_GEN, ST_TOPIC, ST_OFF, ST_LEN, ST_N, ST_LAST, ST_SENT = range(8)
ST_ROWS = 8

# out: the reads for Python (rows), and OUT_KIND's values
OUT_FD, OUT_KIND, OUT_OFF, OUT_LEN = range(4)
OUT_ROWS = 4
DATA, CLOSED = 1, 2

# counts: one read's totals
CN_STAGED, CN_OTHER, CN_TOPICS = range(3)
COUNTS = 3

# res: one lane call's outcome, and RES_CODE's values
RES_CODE, RES_EVENTS, RES_TALLIES, RES_ATTENTION, RES_MOVERS, RES_STAGED, RES_FORWARDS, RES_DRAINED = range(8)
RES_WORDS = 8
R_EVENTS, R_READ, R_SETTLED, R_TIMEOUT, R_OWN, R_DRAINED = range(6)

# ow: the own path's words
MAX_ROWS = 4     # channels one armed topic may deliver to in the kernel
MAX_N = 16       # messages (PUBs, MPUBs) one read may stage for the kernel to take
MAX_FINS = 64    # FINs the lane may take before Python applies them
OW_ARMED, OW_T, OW_NODE, OW_TICK, OW_SEQ, OW_ROWS, OW_TOPIC_INDEX, OW_WBASE, OW_FINS = range(9)
HEAD = 9
RW_CH, RW_KEY, RW_CONN, RW_FD, RW_FREE, RW_TIMEOUT, RW_GOT, RW_END, RW_SENT, RW_DEADLINE, RW_FINS, RW_TTL = range(12)
ROW = 12
ROWS_AT = HEAD
A_TS = ROWS_AT + MAX_ROWS * ROW
A_IDS, A_NB, A_POS = A_TS + MAX_N, A_TS + 2 * MAX_N, A_TS + 3 * MAX_N   # A_POS: an empty slice (no positions)
READ_AT = A_TS + 3 * MAX_N
SLOTS_AT = READ_AT + 7 * MAX_N
FN_ROW = SLOTS_AT + MAX_ROWS * MAX_N
FN_SLOT = FN_ROW + MAX_FINS
FN_ID, FN_STATUS, FN_FREED = FN_SLOT + MAX_FINS, FN_SLOT + MAX_FINS + 1, FN_SLOT + MAX_FINS + 2
RD_AT = FN_FREED + 1  # the round words (RD_*, below) of the row ``own_publish`` delivers to
DR_OFF = RD_AT + 12
DR_LEN = DR_OFF + MAX_N
OW_WORDS = DR_LEN + MAX_N

# counts (the pump's words): after one read's totals (CN_*), the pump's settings, written by ``Pump.__init__``,
# read by ``pump._read``, ``_settle_and_send`` and ``fastlane.serve``
PW_EPFD, PW_MAX_MSG, PW_MAX_BODY, PW_ME, PW_MODE = range(COUNTS, COUNTS + 5)
PUMP_WORDS = COUNTS + 5

# the pump's per-fd state, one column per fd (grown on demand, ``Pump._fd_arrays``), one block per dtype.
# fd_int (int64):
#   FD_GEN           bumped whenever the fd joins or leaves the pump (``Pump.add`` / ``remove``): an OK staged for a
#                    connection that closed, maybe with its fd reused, is never sent. Read by ``_read``, ``_settle_and_send``
#   FD_TALLY, FD_TALLY_TOPIC   the session's current run of lone PUBs: count and topic (``_settle_and_send`` writes;
#                    ``Pump.settle`` and the stats rows fold and reset them)
#   FD_STREAK, FD_STREAK_OWNER   the move streak: one-message commands in a row to topics of one worker, and that
#                    worker (``move_decision``)
# fd_flags (uint8):
#   FD_CLEAN         the session's parser holds nothing: a lone PUB may be staged (the session writes; ``_read``)
#   FD_BUSY          output is queued: an OK must go through the session's write buffer (the session and the own
#                    path write; ``_settle_and_send`` reads)
#   FD_MOVED_IN      the producer was moved here because this worker owns its topics (``Pump.add``; ``move_decision``)
#   FD_STAY_OUT      the producer was moved in once and out again: it never moves in again (``Pump.add``;
#                    ``move_decision``)
# fd_times (float64):
#   FD_LAST_READ     time.monotonic() of the last read (``_read``; the session's read deadline, the stats rows)
#   FD_STREAK_T0     when the move streak's current window began (``move_decision``)
#   FD_TOOK_BEFORE   auto: the producer's usual window of MOVE_AFTER (seconds) where it is not on the owner, its
#                    last window once it asks to move in (``move_decision`` keeps it there, the hand-over carries
#                    it, ``Pump.add`` sets it on the owner, where it judges the move)
#   FD_BEST_SINCE    auto: the fastest window of a producer moved in, on the owner (``move_decision``)
#   FD_WATCHED       auto: when its move streak's first window began (``move_decision``: no move in before the
#                    producer was watched WATCH_S)
FD_GEN, FD_TALLY, FD_TALLY_TOPIC, FD_STREAK, FD_STREAK_OWNER = range(5)
FD_INT_ROWS = 5
FD_CLEAN, FD_BUSY, FD_MOVED_IN, FD_STAY_OUT = range(4)
FD_FLAG_ROWS = 4
FD_LAST_READ, FD_STREAK_T0, FD_TOOK_BEFORE, FD_BEST_SINCE, FD_WATCHED = range(5)
FD_TIME_ROWS = 5

# topic_words: the pump's per-topic words, one column per pump topic id (MAX_TOPICS)
#   TP_NAME_LEN      the name's length in ``names`` (``Pump.learn_topic``; ``find_topic``, the forward's encoder)
#   TP_OWNER         the worker that owns it (``learn_topic``; ``serve``, ``move_decision``)
#   TP_FAILED        0, or FAILED / PARKED while ``Pump.commit`` answers a publish refused or parked
#   TP_FULL_AT, TP_FULL_VAL   the control word (and its value) that says its owner marked it full
#                    (``FastLane._learn`` writes them as topics appear; -1: not known yet; ``serve`` reads)
TP_NAME_LEN, TP_OWNER, TP_FAILED, TP_FULL_AT, TP_FULL_VAL = range(5)
TP_ROWS = 5

# sw: what ``_settle_and_send`` reports, ``(SW_ROWS, MAX_EVENTS)`` int64: tallies of sessions that switched topics
# (SW_FD, SW_TOPIC, SW_COUNT: folded by ``Pump.settled``) and producers that should move (SW_MOVER)
SW_FD, SW_TOPIC, SW_COUNT, SW_MOVER = range(4)
SW_ROWS = 4

# lane: one ``fastlane.serve`` call's words: its outcome (RES_*, above), then its inputs, written by
# ``FastLane._serve`` before the call
LN_MAIN_EP = RES_WORDS    # the loop's epoll fd, which the lane waits on
LN_UNTIL_NS = RES_WORDS + 1   # time.monotonic_ns() to return at (R_TIMEOUT), or -1: no limit
LN_SLICE_NS = RES_WORDS + 2   # how long a busy lane runs once its first forward or FIN is done (SLICE)
LN_LARGE = RES_WORDS + 3      # the biggest forward the ring takes (bigger ones go by file: Python's)
LN_EVENTFD = RES_WORDS + 4    # this worker's eventfd (every commit to one of its rings may write it)
LN_SCAN_CTL = RES_WORDS + 5   # the control block of the scanner's ring to this worker (its word in the buffer)
LN_DRAIN = RES_WORDS + 6      # 1 when the lane may take forwards to the armed topic from the input rings
LANE_WORDS = RES_WORDS + 7

# rings: the lane's view of this worker's rings to the others, ``(RG_ROWS, workers)`` int64, written by
# ``FastLane.__init__``, read by ``forward_staged`` and ``serve``
#   RG_CTL_AT (in int64 words) and RG_DATA_AT (in bytes): where the ring's control block and data start in the
#   rings' buffer; RG_CAPACITY its data's size; RG_EVENTFD the owner's eventfd (its wake-up)
RG_CTL_AT, RG_DATA_AT, RG_CAPACITY, RG_EVENTFD = range(4)
RG_ROWS = 4

# rin: the lane's view of this worker's input rings (one per producer slot but its own, ``Forwarder.pub_in``'s
# order), ``(RI_ROWS, rings)`` int64, written by ``FastLane.__init__``, read by ``ownpath.own_drain``
#   RI_CTL_AT, RI_DATA_AT, RI_CAPACITY   as RG_*; RI_PROC the sender's wake-up line and RI_WAKE_FD its eventfd
#   (the sender waits for room: ``records.want_room``)
RI_CTL_AT, RI_DATA_AT, RI_CAPACITY, RI_PROC, RI_WAKE_FD = range(5)
RI_ROWS = 5

# rd: one delivery round's words (``kernels.deliver_round``), ``(ROUND_WORDS,)`` int64, written by its caller
# (``Channel._deliver_round``; ``ownpath.own_publish`` for each armed row, in ``ow`` at RD_AT), read by the kernel
#   RD_CH            the channel's log slot                RD_BUDGET  at most this many records
#   RD_MAX_BYTES     at most this many bytes of frames (a lone bigger record goes alone)
#   RD_NOW, RD_DEADLINE   time.time_ns() now, and the round's in-flight deadline
#   RD_TOPIC, RD_KEY, RD_CONN   the topic's index, the channel's key and the consumer's connection (slots name them)
#   RD_WBASE         the worker's suspect words' base (``workers/storage/poison.py``)
#   RD_FD            the consumer's socket, or -1: frame only (output is queued before them)
#   RD_TTL_CUTOFF    the channel's TTL as a publish timestamp (ns): a record published before it has expired, and
#                    the round stops before it (the general path expires it); 0: the channel has no TTL
#   RD_MAX_ATTEMPTS  the channel's max_attempts: a record already delivered that many times (loaded or recovered
#                    after a stop or crash) is the general path's, which dead-letters it; 0: none
(RD_CH, RD_BUDGET, RD_MAX_BYTES, RD_NOW, RD_DEADLINE, RD_TOPIC, RD_KEY, RD_CONN, RD_WBASE, RD_FD,
 RD_TTL_CUTOFF, RD_MAX_ATTEMPTS) = range(12)
ROUND_WORDS = 12
assert DR_OFF == RD_AT + ROUND_WORDS
