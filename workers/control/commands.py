"""Control commands a topic's owner carries out for other processes (the HTTP API, a lookupd registrar).

Theory of operation: a command names an operation, a topic and (for channel operations) a channel; it travels to
the topic's owner worker (``workers/control/client.py`` carries it), which applies it with
``Worker.control_command`` and answers one of the status codes below. The effects are NSQ's (spec 2.2):

    topic_create      the topic exists afterwards (idempotent)
    topic_delete      the topic, its channels, messages and consumers are gone
    topic_empty       the topic's own queue is cleared (channels keep theirs, as nsqd's /topic/empty)
    topic_pause       no channel of the topic delivers; publishing goes on
    topic_unpause
    channel_create    the channel exists afterwards (and its topic)
    channel_delete    the channel, its messages (memory, disk, in flight, deferred) and consumers are gone
    channel_empty     the channel's queue, in-flight and deferred messages are cleared; consumers stay
    channel_pause     the channel stops delivering; its messages keep piling up
    channel_unpause
    policy_changed    the topic's or one of its channels' config changed in the policy file (the sender wrote it):
                      the owner re-reads the file and gives each channel of the topic its effective policy again;
                      a topic that does not exist is left so (its channels get the config when they are made)

Statuses are small non-negative ints so they fit one shared word of a reply.
"""
OPS = ("topic_create", "topic_delete", "topic_empty", "topic_pause", "topic_unpause",
       "channel_create", "channel_delete", "channel_empty", "channel_pause", "channel_unpause",
       "policy_changed")  # new operations go last: a code is its place here
OP_CODES = {name: i + 1 for i, name in enumerate(OPS)}
OP_NAMES = {code: name for name, code in OP_CODES.items()}

OK = 0
TOPIC_NOT_FOUND = 1
CHANNEL_NOT_FOUND = 2
FAILED = 3            # storage could not be had (the owner logged why)
INVALID = 4           # unknown operation, or a channel operation without a channel
NOT_OWNER = 5         # sent to a worker that does not own the topic
NOT_IMPLEMENTED = 6

STATUS_NAMES = {OK: "OK", TOPIC_NOT_FOUND: "TOPIC_NOT_FOUND", CHANNEL_NOT_FOUND: "CHANNEL_NOT_FOUND",
                FAILED: "FAILED", INVALID: "INVALID", NOT_OWNER: "NOT_OWNER", NOT_IMPLEMENTED: "NOT_IMPLEMENTED"}
