"""nsqpy's NSQ client: an asyncio core (`AsyncProducer`, `AsyncConsumer`) and a thread-safe blocking API over
it (`Producer`, `Consumer`), both speaking V2 through `nsqpy.protocol`'s client codec.

Importing this package loads neither numba nor any broker module (a test checks it): it is meant for every
Spark executor and script.
"""

from nsqpy.client.blocking import Consumer, Producer
from nsqpy.client.config import Config
from nsqpy.client.consumer import AsyncConsumer
from nsqpy.client.errors import (ClientError, ConnectionClosed, InvalidName, NoConnection, ProtocolError,
                                 StoppedError)
from nsqpy.client.message import Message
from nsqpy.client.producer import AsyncProducer
from nsqpy.protocol.dead_letter import decode as decode_dead_letter  # a dead-letter topic's messages (nsqpy only)

__all__ = ["Producer", "Consumer", "AsyncProducer", "AsyncConsumer", "Config", "Message", "ProtocolError",
           "ClientError", "ConnectionClosed", "InvalidName", "NoConnection", "StoppedError", "decode_dead_letter"]
