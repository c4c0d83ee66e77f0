package share

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A share member the broker refuses (no ACL for the group or the topic)
// is never told so by kgo in a way that ends anything: its heartbeats and
// fetches fail, and kgo retries them for as long as the refusal lasts.
// So Subscribe asks first, as the principal the members use, and a
// refusal met later (an ACL removed while consuming) is reported through
// Ready.

// checkAccess fails when the client's principal may not read topic
// (Metadata: TOPIC_AUTHORIZATION_FAILED) or use group
// (ShareGroupDescribe: GROUP_AUTHORIZATION_FAILED; a group that does not
// exist yet is fine). Errors that do not tell (a request that fails) are
// left to the members.
func checkAccess(ctx context.Context, client *kgo.Client, group, topic string) error {
	meta := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(topic)
	meta.Topics = append(meta.Topics, mt)
	if resp, err := meta.RequestWith(ctx, client); err == nil {
		for _, t := range resp.Topics {
			if err := kerr.ErrorForCode(t.ErrorCode); errors.Is(err, kerr.TopicAuthorizationFailed) {
				return refused(fmt.Sprintf("topic %q", topic), "READ on the topic", err)
			}
		}
	}
	desc := kmsg.NewPtrShareGroupDescribeRequest()
	desc.GroupIDs = []string{group}
	resp, err := desc.RequestWith(ctx, client)
	if err == nil {
		for _, g := range resp.Groups {
			if gerr := kerr.ErrorForCode(g.ErrorCode); gerr != nil {
				err = gerr
			}
		}
	}
	// The refusal comes in the answer, or from the coordinator lookup
	// before it (FindCoordinator checks the group's ACLs too).
	if errors.Is(err, kerr.GroupAuthorizationFailed) {
		return refused(fmt.Sprintf("share group %q", group), "READ on the group", err)
	}
	return nil
}

// refused is the error of a resource the principal may not use.
func refused(what, needs string, err error) error {
	return fmt.Errorf("%s: the client's principal is not authorized to use it (it needs %s): %w", what, needs, err)
}

// authorizationError returns err, said of the member's group or topic,
// when it is a refusal that lasts until someone changes an ACL; nil
// otherwise.
func (sub *Subscription) authorizationError(err error) error {
	switch {
	case errors.Is(err, kerr.GroupAuthorizationFailed):
		return refused(fmt.Sprintf("share group %q", sub.cfg.ShareGroup), "READ on the group", err)
	case errors.Is(err, kerr.TopicAuthorizationFailed):
		return refused(fmt.Sprintf("topic %q", sub.topic), "READ on the topic", err)
	}
	return nil
}
