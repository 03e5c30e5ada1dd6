//! hoptrace publisher: open-loop, rate-controlled traced load for MQTT and Kafka.
