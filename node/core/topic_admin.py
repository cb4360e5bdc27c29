"""Topic administration for every front (gRPC's Admin service and Kafka's CreateTopics,
DeleteTopics, CreatePartitions, AlterConfigs and IncrementalAlterConfigs): plain types in
and out, Headwater's error codes, no protocol type.

Changes are decisions of the active controller: made here when this node is the active
controller, otherwise passed to it through a ``ControllerLink`` (one hop; a change that
was itself passed on is never passed again). After a change the answer waits (up to
``METADATA_WAIT_S``) until this node's image, and its logs, show it, so a client that
next asks this node sees its change.

Rules written here once: who may create (``create`` on the cluster, or on each topic
named), delete (``delete`` on each) or alter (``alter`` on the topic), each checked
before a topic's existence is looked at; at most ``topics_max`` topics a request; a
config named twice in one change is refused; a cluster that is starting is given one
broker session to have enough live brokers for the replicas asked.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Final, Protocol, TypeVar

from headwater.node.cluster.cluster_state import ClusterState
from headwater.node.cluster.controller import ControllerDriver, not_controller
from headwater.node.config import NodeConfig, topic_setting_name
from headwater.node.core.limits import check_count
from headwater.node.security.authorizer import Authorizer
from headwater.raft.metadata import decisions
from headwater.raft.metadata.decisions import NewTopic, TopicOutcome
from headwater.raft.metadata.image import MetadataImage
from headwater.shared.acls import CLUSTER_RESOURCE, Operation, ResourceType
from headwater.shared.errors import ErrorCode, HeadwaterError

T = TypeVar("T")
METADATA_WAIT_S: Final = 5.0
ConfigChanges = Sequence[tuple[str, str | None]]
"""A topic's config changes in order: (name, the node's or Kafka's, new value or None to
remove the override)."""


class ControllerLink(Protocol):
    """How a change reaches the active controller at ``address`` when this node is not
    it (the gRPC front's forwarding). Each raises the controller's refusal."""

    async def create_topics(
        self, address: str, wanted: Sequence[NewTopic], validate_only: bool
    ) -> list[TopicOutcome]: ...

    async def delete_topics(self, address: str, names: Sequence[str]) -> list[TopicOutcome]: ...

    async def create_partitions(self, address: str, topic: str, count: int) -> None: ...

    async def alter_topic_configs(
        self,
        address: str,
        topic: str,
        changes: Mapping[str, str | None],
        replace: bool,
        validate_only: bool,
    ) -> dict[str, str]: ...


class TopicAdmin:
    """Topic changes on one node (see the module doc)."""

    def __init__(
        self,
        config: NodeConfig,
        state: ClusterState,
        controller: ControllerDriver | None,
        link: ControllerLink,
        *,
        authorizer: Authorizer,
    ) -> None:
        self.config = config
        self.state = state
        self.controller = controller
        self.link = link
        self.auth = authorizer

    def controller_address(self, forwarded: bool) -> str | None:
        """None when this node is the active controller; else where it is. Raises
        NOT_CONTROLLER for a change passed on already, or with no controller known."""
        if self.controller is not None and self.controller.is_active():
            return None
        image = self.state.image
        if forwarded or not image.controller_internal_address:
            raise not_controller(image)
        return image.controller_internal_address

    async def _decide(
        self,
        decide: Callable[[ControllerDriver, MetadataImage, int], decisions.ControllerResult[T]],
    ) -> T:
        assert self.controller is not None
        response, _ = await self.controller.run(functools.partial(decide, self.controller))
        return response

    async def _wait_for_brokers(self, wanted: Sequence[NewTopic]) -> None:
        """A cluster that is starting has fewer live brokers than it will have in a moment:
        wait up to one broker session for enough of them to place the replicas asked for
        (the decision then reports any that are still missing). No wait when more are
        asked for than the cluster has brokers (registered, or voters that will register):
        waiting cannot help, and the refusal comes at once."""
        needed = max(
            (
                t.replication_factor
                if t.replication_factor is not None
                else self.config.default_replication_factor
                for t in wanted
            ),
            default=1,
        )
        image = self.state.image
        voters = len(self.config.quorum_voters) if self.config.is_broker else 0
        if needed > max(len(image.brokers), voters):
            return
        await self.state.wait_until(
            lambda image: len(image.live_broker_ids()) >= needed,
            self.config.broker_session_timeout_ms / 1000,
        )

    async def _wait_for_local_logs(self) -> None:
        """Let this node's logs catch up with its image, so that the caller's next request
        here finds the partitions it just made."""
        if self.config.is_broker:
            await self.state.wait_reconciled(self.state.image.offset, METADATA_WAIT_S)

    def check_topics_named(self, count: int) -> None:
        """INVALID_REQUEST for a request naming more than ``topics_max`` topics (a front
        may ask before it translates them)."""
        check_count(count, self.config.topics_max, "topics", "topics_max")

    async def create_topics(
        self, wanted: Sequence[NewTopic], validate_only: bool = False, forwarded: bool = False
    ) -> list[TopicOutcome]:
        """Create ``wanted`` (each topic's outcome, in order). Needs ``create`` on the
        cluster, or on each topic named; at most ``topics_max`` topics."""
        self.check_topics_named(len(wanted))
        if not self.auth.allows(Operation.CREATE, ResourceType.CLUSTER, CLUSTER_RESOURCE):
            for topic in wanted:
                self.auth.require(Operation.CREATE, ResourceType.TOPIC, topic.name)
        await self._wait_for_brokers(wanted)
        address = self.controller_address(forwarded)
        if address is None:
            outcomes = await self._decide(
                lambda controller, image, epoch: decisions.create_topics(
                    image, epoch, wanted, controller.limits, controller.rng, validate_only
                )
            )
        else:
            outcomes = await self.link.create_topics(address, wanted, validate_only)
        ids = {o.topic_id for o in outcomes if o.topic_id and o.error is None}
        await self.state.wait_until(lambda image: ids <= set(image.topic_names), METADATA_WAIT_S)
        await self._wait_for_local_logs()
        return outcomes

    async def delete_topics(
        self, names: Sequence[str], forwarded: bool = False
    ) -> list[TopicOutcome]:
        """Delete the topics ``names`` (each one's outcome, in order). Needs ``delete``
        on each; at most ``topics_max`` names."""
        check_count(len(names), self.config.topics_max, "topic names", "topics_max")
        for name in names:
            self.auth.require(Operation.DELETE, ResourceType.TOPIC, name)
        before = {n: t.topic_id for n, t in self.state.image.topics.items() if n in names}
        address = self.controller_address(forwarded)
        if address is None:
            outcomes = await self._decide(
                lambda _controller, image, epoch: decisions.delete_topics(image, epoch, names)
            )
        else:
            outcomes = await self.link.delete_topics(address, names)
        # Wait for the deletions the controller made, not for refused ones to vanish.
        deleted = {before[o.name] for o in outcomes if o.error is None and o.name in before}
        await self.state.wait_until(
            lambda image: not deleted & set(image.topic_names), METADATA_WAIT_S
        )
        return [TopicOutcome(o.name, o.error) for o in outcomes]

    async def create_partitions(self, topic: str, count: int, forwarded: bool = False) -> None:
        """Grow ``topic`` to ``count`` partitions, placed by the controller. Needs
        ``alter`` on the topic."""
        self.auth.require(Operation.ALTER, ResourceType.TOPIC, topic)
        address = self.controller_address(forwarded)
        if address is None:
            await self._decide(
                lambda controller, image, epoch: decisions.create_partitions(
                    image, epoch, topic, count, controller.limits, controller.rng
                )
            )
        else:
            await self.link.create_partitions(address, topic, count)
        await self.state.wait_until(
            lambda image: len(getattr(image.topics.get(topic), "partitions", ())) >= count,
            METADATA_WAIT_S,
        )
        await self._wait_for_local_logs()

    async def alter_topic_configs(
        self,
        topic: str,
        changes: ConfigChanges,
        replace: bool = False,
        validate_only: bool = False,
        forwarded: bool = False,
    ) -> dict[str, str]:
        """Change ``topic``'s config overrides (``replace``: they become exactly the ones
        given); the overrides it then has. Names are the node's or Kafka's
        (``topic_setting_name``), each once. Needs ``alter`` on the topic."""
        self.auth.require(Operation.ALTER, ResourceType.TOPIC, topic)
        by_setting: dict[str, str | None] = {}
        # Each change is a known setting not seen before, or the loop ends refusing it:
        # no more than len(TOPIC_SETTINGS) + 1 changes are ever looked at.
        for name, value in changes:
            setting = topic_setting_name(name)
            if setting in by_setting:
                raise HeadwaterError(
                    ErrorCode.INVALID_CONFIG,
                    f"topic config {setting} is changed twice in one request; change it once",
                )
            by_setting[setting] = value
        address = self.controller_address(forwarded)
        if address is None:
            configs = await self._decide(
                lambda controller, image, epoch: decisions.alter_topic_configs(
                    image,
                    epoch,
                    topic,
                    by_setting,
                    replace,
                    controller.limits,
                    validate_only,
                )
            )
        else:
            configs = await self.link.alter_topic_configs(
                address, topic, by_setting, replace, validate_only
            )
        if not validate_only:
            await self.state.wait_until(
                lambda image: (
                    topic not in image.topics or dict(image.topics[topic].configs) == configs
                ),
                METADATA_WAIT_S,
            )
            await self._wait_for_local_logs()
        return dict(configs)
