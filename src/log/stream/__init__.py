"""The log on NATS JetStream: the link (jetstream), the writer lease (lease), where a store stands on
its stream (position) and async shipping (shipper). Nothing here imports projections or storage."""

__all__: list[str] = []  # the package offers its modules
