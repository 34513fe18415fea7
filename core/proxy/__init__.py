"""The Kafka protocol proxy: virtual clusters, gateways and filter chains."""
