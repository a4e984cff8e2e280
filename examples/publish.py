#!/usr/bin/env python3
"""Publish one redeliver notification with pika, straight to the exchange.

This is the interop contract: any AMQP client can produce notifications.
The worker (`redeliver run`) declares the topology; run it once first, or
run `redeliver publish` once, so `<prefix>.notifications` exists.

    pip install pika
    REDELIVER_AMQP_URL=amqp://guest:guest@127.0.0.1:5674/%2f \
        python3 examples/publish.py http://127.0.0.1:8080/hook
"""
import json
import os
import sys
import uuid

import pika

amqp_url = os.environ.get("REDELIVER_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
prefix = os.environ.get("REDELIVER_PREFIX", "redeliver")
target = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080/hook"

notification = {
    "v": 1,
    "id": str(uuid.uuid4()),  # stable across retries; receivers deduplicate on it
    "url": target,
    "body": {"event": "job.done", "job": 42},
    "headers": {"X-Source": "pika-example"},
    "max_attempts": 5,
    "schedule": ["15s", "30s", "3m"],
}

connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
channel = connection.channel()
channel.confirm_delivery()  # publish() raises unless the broker confirms
channel.basic_publish(
    exchange=f"{prefix}.notifications",
    routing_key="",
    body=json.dumps(notification).encode(),
    properties=pika.BasicProperties(
        content_type="application/json",
        delivery_mode=2,  # persistent
        message_id=notification["id"],
    ),
    mandatory=True,  # fail if no queue is bound (topology not declared yet)
)
print(notification["id"])
connection.close()
