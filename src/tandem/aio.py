"""The asyncio client API: `conn = await tandem.aio.connect(url)`."""

from .client.connection import AsyncConnection, FailureEvent, connect
from .client.message import Message, ReceivedMessage
from .client.session import AsyncConsumer, AsyncProducer, AsyncSession

__all__ = [
    "AsyncConnection",
    "AsyncConsumer",
    "AsyncProducer",
    "AsyncSession",
    "FailureEvent",
    "Message",
    "ReceivedMessage",
    "connect",
]
