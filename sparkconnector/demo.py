"""``make demo``: a live pipeline on a local 3-node cluster.

1. Three nodes start: ports from ``--base-port`` (``make demo DEMO_BASE_PORT=P``; by
   default a block of 6 free ports), data under ``--data-dir`` (``DEMO_DATA_DIR``; by
   default a new temporary folder, removed when the demo stops).
2. Topics ``orders`` (6 partitions) and ``sales-per-retailer`` (3 partitions), both with
   3 replicas and ``min_insync_replicas`` 2.
3. An order generator sends JSON orders keyed by retailer (``{"order_id", "retailer",
   "amount", "ts"}``): every order of a retailer lands on one partition, in order.
4. A Spark Structured Streaming job reads ``orders`` with ``format("headwater")``,
   totals sales per retailer in 10-second event-time windows, prints the running totals
   as they change, and writes each closed window (watermark 5 s) back to
   ``sales-per-retailer`` as JSON keyed by retailer.

``headwater consume sales-per-retailer --from-beginning --print-key`` shows the output.
Ctrl-C (or ``--duration``) stops the queries, the generator and the nodes, in that order.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Final

import click
from pyspark.sql import functions as f

from headwater.client import Admin, Producer
from headwater.shared.errors import HeadwaterError
from headwater.sparkconnector.session import local_session
from headwater.tools.devcluster import start_dev_cluster, stop_dev_cluster
from headwater.tools.ports import free_port_block

RETAILERS: Final = ("acme", "bolt", "crate", "dune", "ember", "fjord", "grove", "harbor")
ORDERS_TOPIC: Final = "orders"
SALES_TOPIC: Final = "sales-per-retailer"
ORDER_SCHEMA: Final = "order_id BIGINT, retailer STRING, amount DOUBLE, ts BIGINT"


def generate_orders(bootstrap: str, rate: int, stop: threading.Event) -> None:
    """Send ``rate`` orders per second until ``stop`` is set."""
    rng = random.Random(7)
    weights = [rng.uniform(0.5, 3.0) for _ in RETAILERS]
    with Producer(bootstrap, acks="all", linger_ms=20) as producer:
        order_id = 0
        began = time.monotonic()
        while not stop.is_set():
            due = int((time.monotonic() - began) * rate)
            while order_id < due:
                retailer = rng.choices(RETAILERS, weights)[0]
                order = {
                    "order_id": order_id,
                    "retailer": retailer,
                    "amount": round(rng.uniform(5, 250), 2),
                    "ts": int(time.time() * 1000),
                }
                producer.send(ORDERS_TOPIC, json.dumps(order).encode(), key=retailer.encode())
                order_id += 1
            stop.wait(0.05)


def start_queries(spark: Any, bootstrap: str, data_dir: Path) -> list[Any]:
    orders = (
        spark.readStream.format("headwater")
        .option("bootstrap", bootstrap)
        .option("subscribe", ORDERS_TOPIC)
        .option("startingOffsets", "earliest")
        .load()
        .select(f.from_json(f.col("value").cast("string"), ORDER_SCHEMA).alias("o"))
        .select("o.*")
        .withColumn("event_time", f.timestamp_millis("ts"))
    )
    sales = (
        orders.withWatermark("event_time", "5 seconds")
        .groupBy(f.window("event_time", "10 seconds"), "retailer")
        .agg(f.round(f.sum("amount"), 2).alias("sales"), f.count("*").alias("orders"))
    )
    console = (
        sales.select(
            f.date_format("window.start", "HH:mm:ss").alias("window"),
            "retailer",
            "sales",
            "orders",
        )
        .writeStream.outputMode("update")
        .format("console")
        .option("truncate", "false")
        .option("numRows", 50)
        .option("checkpointLocation", str(data_dir / "checkpoints" / "console"))
        .trigger(processingTime="2 seconds")
        .start()
    )
    to_topic = (
        sales.select(
            f.col("retailer").cast("binary").alias("key"),
            f.to_json(
                f.struct(
                    f.col("window.start").alias("window_start"),
                    f.col("window.end").alias("window_end"),
                    "retailer",
                    "sales",
                    "orders",
                )
            ).alias("value"),
        )
        .writeStream.outputMode("append")
        .format("headwater")
        .option("bootstrap", bootstrap)
        .option("topic", SALES_TOPIC)
        .option("checkpointLocation", str(data_dir / "checkpoints" / "sales"))
        .trigger(processingTime="2 seconds")
        .start()
    )
    return [console, to_topic]


def run_demo(base_port: int, data_dir: Path, rate: int, duration_s: float) -> None:
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    generator_stop = threading.Event()
    generator: threading.Thread | None = None
    spark: Any = None
    queries: list[Any] = []
    cluster = start_dev_cluster(3, base_port, data_dir, stopping.is_set)
    bootstrap = cluster.bootstrap(list(cluster.nodes.values()))
    try:
        click.echo(f"cluster up: {bootstrap} (logs in {data_dir})")
        with Admin(bootstrap) as admin:
            existing = {t.name for t in admin.list_topics()}
            for topic, partitions in ((ORDERS_TOPIC, 6), (SALES_TOPIC, 3)):
                if topic not in existing:
                    admin.create_topic(
                        topic,
                        partitions,
                        replication_factor=3,
                        configs={"min_insync_replicas": "2"},
                    )
        generator = threading.Thread(
            target=generate_orders, args=(bootstrap, rate, generator_stop), daemon=True
        )
        generator.start()
        click.echo(f"order generator: {rate} orders/s keyed by retailer into {ORDERS_TOPIC!r}")
        spark = local_session("headwater-demo")
        # pyspark's own Ctrl-C handler cancels every running job, which ends the queries
        # with errors; this one lets them stop in order instead.
        signal.signal(signal.SIGINT, lambda *_: stopping.set())
        queries = start_queries(spark, bootstrap, data_dir)
        click.echo(
            f"Spark job running; closed windows go to {SALES_TOPIC!r}. In another shell:\n"
            f"  .venv/bin/headwater consume {SALES_TOPIC} --from-beginning --print-key "
            f"--bootstrap {bootstrap}\nCtrl-C stops everything."
        )
        sys.stdout.flush()
        deadline = time.monotonic() + duration_s if duration_s > 0 else float("inf")
        while not stopping.is_set() and time.monotonic() < deadline:
            for query in queries:
                if not query.isActive:
                    raise click.ClickException(f"a query stopped: {query.exception()}")
            stopping.wait(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        click.echo("stopping...")
        if spark is not None:  # stopping a query mid-batch logs the batch's abort
            spark.sparkContext.setLogLevel("FATAL")
        for query in queries:
            query.stop()
        if queries:
            _report(bootstrap)
        if spark is not None:
            spark.stop()
        generator_stop.set()
        if generator is not None:
            generator.join(timeout=30)
        stopped = stop_dev_cluster(cluster)
        if stopped:
            click.echo(f"stopped {stopped} node(s)")


def _report(bootstrap: str) -> None:
    with Admin(bootstrap) as admin:
        orders = sum(admin.list_offsets(ORDERS_TOPIC).values())
        windows = sum(admin.list_offsets(SALES_TOPIC).values())
    click.echo(
        f"{ORDERS_TOPIC!r} holds {orders} orders; {SALES_TOPIC!r} holds {windows} window results"
    )


@click.command()
@click.option(
    "--base-port",
    type=click.IntRange(0, 65000),
    default=0,
    show_default=True,
    help="Node i serves gRPC on BASE + 2(i-1) and Raft on the port after; 0: free ports.",
)
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where the nodes and the queries keep their data (kept); default: a new "
    "temporary folder, removed when the demo stops.",
)
@click.option(
    "--rate",
    type=click.IntRange(1, 100_000),
    default=200,
    show_default=True,
    help="Orders per second.",
)
@click.option(
    "--duration",
    "duration_s",
    type=click.FloatRange(0),
    default=0.0,
    help="Stop after this many seconds (0: run until Ctrl-C).",
)
def main(base_port: int, data_dir: Path | None, rate: int, duration_s: float) -> None:
    """Run the live demo: 3 nodes, an order generator, a Spark job (see the module doc)."""
    if base_port and base_port < 1024:
        raise click.BadParameter(
            f"{base_port}; give 0 (free ports) or 1024..65000", param_hint="--base-port"
        )
    folder = Path(tempfile.mkdtemp(prefix="headwater-demo-")) if data_dir is None else data_dir
    try:
        run_demo(base_port or free_port_block(6), folder, rate, duration_s)
    except HeadwaterError as error:
        raise click.ClickException(f"{error} (logs kept in {folder})") from None
    except BaseException:
        click.echo(f"the demo failed; its logs are kept in {folder}", err=True)
        raise
    if data_dir is None:  # a clean stop: the temporary folder goes
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
