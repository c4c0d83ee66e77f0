package frontier_test

import (
	"fmt"

	"github.com/safeack/safeack/frontier"
)

// The article's scenario: the assignment starts at 100 and one batch delivers
// offsets 100, 104 and 105 (101..103 are holes left by compaction), with 106
// as the position after the batch. The records finish in the order 105, 100,
// 104. Committing 106 when 105 finishes would lose 100 and 104 on a crash;
// the tracker holds at 100, moves to 104 (not 101: nothing waits for offsets
// that were never delivered), and reaches 106 only when 104 is done. A
// replacement tracker for the same partition never accepts an old ticket.
func ExampleTracker() {
	tr, err := frontier.New(100, 3)
	if err != nil {
		panic(err)
	}
	tickets, err := tr.Offer([]int64{100, 104, 105}, 106)
	if err != nil {
		panic(err)
	}
	safe, _ := tr.SafeOffset()
	fmt.Println("initial: safe =", safe)

	for _, tk := range []frontier.Ticket{tickets[2], tickets[0], tickets[1]} {
		tr.Complete(tk)
		safe, _ := tr.SafeOffset()
		st := tr.Stats()
		fmt.Printf("completed %d: safe = %d, retained = %d, blocked = %d, done beyond the prefix:",
			tk.Offset(), safe, st.Retained, st.Blocked)
		for _, r := range tr.AppendCompleted(nil) {
			fmt.Printf(" [%d,%d)", r.From, r.To)
		}
		fmt.Println()
	}
	fmt.Println("duplicate accepted:", tr.Complete(tickets[2]))

	old := tickets[0]
	tr.Revoke()
	replacement, _ := frontier.New(100, 3)
	if _, err := replacement.Offer([]int64{100, 104, 105}, 106); err != nil {
		panic(err)
	}
	fmt.Println("old completion accepted:", replacement.Complete(old))

	// Output:
	// initial: safe = 100
	// completed 105: safe = 100, retained = 3, blocked = 1, done beyond the prefix: [105,106)
	// completed 100: safe = 104, retained = 2, blocked = 1, done beyond the prefix: [105,106)
	// completed 104: safe = 106, retained = 0, blocked = 0, done beyond the prefix:
	// duplicate accepted: false
	// old completion accepted: false
}
