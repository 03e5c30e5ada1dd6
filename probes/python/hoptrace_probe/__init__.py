"""hoptrace probe for Python: the part of hoptrace that lives inside a pipeline under test.

A message carries a :class:`TraceContext` (trace key, metric count, intended send time and
up to 16 hop stamps); every hop it passes appends its own timestamp in-band with
:meth:`Probe.stamp` and hands it to the collector out of band with :meth:`Probe.report`
(both at once: :meth:`Probe.record`). An :class:`Exporter` thread batches the reports into
frames over TCP to ``hoptrace collect``.

- :mod:`.context`: the trace context, binary and text forms (``docs/trace-format.md``);
- :mod:`.carrier`: MQTT v5 user properties, Kafka headers, payload envelope;
- :mod:`.protocol`: the probe-to-collector frames (``docs/collector-protocol.md``);
- :mod:`.clock`: the host's clock status;
- :mod:`.publisher`: new contexts, the ``publish`` stamp and the Sent accounting.

The core uses the standard library only. The hot path takes no lock and never waits:
when the queue is full the record is dropped and counted, and the counts reach the
collector.

Example, a processor between two MQTT topics::

    from hoptrace_probe import Exporter, ExporterConfig
    from hoptrace_probe.carrier import mqtt_property

    exporter = Exporter(ExporterConfig("127.0.0.1:7400", "my-processor"),
                        [(1, "flow_in"), (2, "flow_out")])
    flow_in, flow_out = exporter.probe("flow_in"), exporter.probe("flow_out")

    def on_message(client, userdata, msg):
        got = flow_in.counted(mqtt_property.extract, msg.properties)
        if got is None:
            return                      # untraced or undecodable: counted
        ctx = got.context
        flow_in.record(ctx)             # stamp in-band + report out of band
        ...                             # process
        flow_out.record(ctx)
        client.publish("out/topic", payload, properties=mqtt_property.inject(ctx, props))

    summary = exporter.shutdown()       # flush, final counters, goodbye
    assert summary.counters.lost() == 0
"""

from ._version import __version__
from .carrier import BadContext, CarrierError, Extracted, NotTraced
from .context import DecodeError, TraceContext
from .counters import CounterSnapshot, Counters
from .exporter import ExporterConfig, Exporter, ExporterFootprint, ExportSummary
from .probe import LocalQueue, NoStamp, Probe
from .protocol import ProtocolError
from .publisher import Publisher

__all__ = [
    "BadContext", "CarrierError", "CounterSnapshot", "Counters", "DecodeError", "ExportSummary",
    "Exporter", "ExporterConfig", "ExporterFootprint", "Extracted", "LocalQueue", "NoStamp",
    "NotTraced", "Probe", "ProtocolError", "Publisher", "TraceContext", "__version__",
]
