"""Address settings matched by pattern, as Artemis's `<address-settings>`.

Patterns use `.`-separated words, `*` for exactly one word and `#` for any
number of words (zero included). Every pattern that matches an address
contributes the keys it sets; for each key the most specific pattern wins and
keys no pattern sets keep their defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from .message import RoutingType


@dataclass(frozen=True)
class AddressSettings:
    auto_create_queues: bool = True
    auto_create_addresses: bool = True
    auto_delete_queues: bool = False
    auto_delete_addresses: bool = False
    default_address_routing_type: RoutingType = RoutingType.ANYCAST
    default_queue_routing_type: RoutingType = RoutingType.ANYCAST
    dead_letter_address: str | None = None
    expiry_address: str | None = None
    expiry_delay: int = -1  # ms; > 0 gives messages without an expiration one
    max_delivery_attempts: int = 10
    redelivery_delay: int = 0  # ms
    redelivery_delay_multiplier: float = 1.0
    max_redelivery_delay: int = -1  # ms; -1: ten times redelivery-delay (Artemis's rule)
    default_consumer_window_size: int = 1024 * 1024
    id_cache_size: int = 20_000
    max_size_bytes: int = -1
    address_full_policy: str = "PAGE"  # PAGE | BLOCK | FAIL | DROP (Artemis's default for new brokers)
    page_size_bytes: int = 10 * 1024 * 1024  # one page file (PAGE policy)
    page_max_cache_size: int = 5  # page files a paging address keeps read in memory
    default_last_value_key: str | None = None
    default_exclusive_queue: bool = False

    def redelivery_delay_for(self, delivery_count: int) -> int:
        """Delay (ms) before redelivering a message that has failed `delivery_count` times."""
        if self.redelivery_delay <= 0:
            return 0
        delay = self.redelivery_delay * self.redelivery_delay_multiplier ** max(delivery_count - 1, 0)
        cap = self.max_redelivery_delay if self.max_redelivery_delay > 0 else self.redelivery_delay * 10
        return int(min(delay, cap))


SETTING_NAMES = {f.name for f in fields(AddressSettings)}


def check_pattern(pattern: str) -> None:
    """Raise ValueError naming the problem if `pattern` is not a valid match expression."""
    if not pattern:
        raise ValueError("an address-settings pattern may not be empty")
    for word in pattern.split("."):
        if word == "" or (("#" in word or "*" in word) and len(word) > 1):
            raise ValueError(f"bad address-settings pattern {pattern!r}: wildcards must be whole words")


def words_match(pattern: tuple[str, ...], address: tuple[str, ...]) -> bool:
    """Artemis wildcard match on words: `*` one word, `#` any number of words."""
    if not pattern:
        return not address
    head = pattern[0]
    if head == "#":
        return any(words_match(pattern[1:], address[i:]) for i in range(len(address) + 1))
    if not address:
        return False
    return (head == "*" or head == address[0]) and words_match(pattern[1:], address[1:])


def pattern_specificity(pattern: str) -> tuple[int, int, int, int]:
    """Sort key: a pattern that sorts higher is more specific (more literal words, fewer wildcards)."""
    words = pattern.split(".")
    literal = sum(1 for w in words if w not in ("#", "*"))
    return (literal, -words.count("#"), -words.count("*"), len(pattern))


class SettingsRepository:
    """Resolves the settings for an address.

    One AddressSettings per distinct set of matching patterns, shared by every address it fits,
    and nothing kept per address name: a cache by name grew by an entry (name, settings, link)
    for every temporary queue ever made, and those long-lived scraps, allocated in the middle of
    a storm of connections, kept Python's allocator from handing that storm's memory back
    (docs/decisions/0057). Matching a name against the patterns costs microseconds, and it is
    done when an address is made (or asked about before it exists), never per message.
    """

    def __init__(self, patterns: dict[str, dict[str, Any]] | None = None) -> None:
        items = []
        for pattern, values in (patterns or {}).items():
            check_pattern(pattern)
            unknown = set(values) - SETTING_NAMES
            if unknown:
                raise ValueError(f"unknown address setting(s) {sorted(unknown)} for {pattern!r}")
            items.append((pattern, tuple(pattern.split(".")), values))
        # least specific first, so more specific ones overwrite
        items.sort(key=lambda it: pattern_specificity(it[0]))
        self._items = items
        self._merged: dict[tuple[int, ...], AddressSettings] = {(): AddressSettings()}

    def match(self, address: str) -> AddressSettings:
        words = tuple(address.split("."))
        hits = tuple(i for i, (_p, pwords, _v) in enumerate(self._items) if words_match(pwords, words))
        found = self._merged.get(hits)
        if found is None:
            merged: dict[str, Any] = {}
            for i in hits:
                merged.update({k: v for k, v in self._items[i][2].items() if v is not None})
            found = self._merged[hits] = replace(AddressSettings(), **merged)
        return found

    def patterns(self) -> list[str]:
        return [p for p, _w, _v in self._items]
