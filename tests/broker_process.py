"""The tests' name for `tandem.testing.broker` (the chaos suite starts brokers the same way)."""

from tandem.testing.broker import BrokerProcess

__all__ = ["BrokerProcess"]
