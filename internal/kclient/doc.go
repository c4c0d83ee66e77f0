// Package kclient holds what safeack asks of Kafka through Sarama outside
// a consumer group session: connections it can close under their requests,
// a client with a coordinator connection of its own, committed offsets and
// listed positions read back, broker configs described, and copies of a
// caller's Sarama config that share nothing stateful, and a Sarama config's
// connection settings carried over to a franz-go client (KgoOptions).
package kclient
