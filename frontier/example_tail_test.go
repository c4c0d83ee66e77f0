package frontier_test

import (
	"fmt"
	"math"

	"github.com/safeack/safeack/frontier"
)

// A partition's head (offset 100) is still running while 101-104 and 107
// are done. Committing 100 alone would replay them after a crash; the tail
// in the metadata lets the next owner skip them.
func ExampleEncodeTail() {
	const committed = 100
	done := []frontier.Range{{From: 101, To: 105}, {From: 107, To: 108}}

	meta, bound, err := frontier.EncodeTail(committed, done, frontier.DefaultMetadataBudget)
	if err != nil {
		panic(err)
	}
	fmt.Printf("commit %d with metadata %q (complete: %v)\n", committed, meta, bound == math.MaxInt64)

	// The next owner fetches offset 100 and this metadata.
	tail, err := frontier.DecodeTail(meta, committed)
	if err != nil {
		panic(err) // a real consumer logs it and processes everything
	}
	for off := int64(committed); off < 109; off++ {
		if tail.Contains(off) {
			fmt.Println(off, "skip")
		} else {
			fmt.Println(off, "process")
		}
	}
	fmt.Println("skipped", tail.Len())
	// Output:
	// commit 100 with metadata "sa1:bZAABB08" (complete: true)
	// 100 process
	// 101 skip
	// 102 skip
	// 103 skip
	// 104 skip
	// 105 process
	// 106 process
	// 107 skip
	// 108 process
	// skipped 5
}

// With a budget too small for the whole tail (16 bytes here, for the sake of
// the example), the longest prefix that fits is encoded and bound says where
// the knowledge ends: offset 34 onwards is processed as if nothing were known.
func ExampleEncodeTail_truncated() {
	var done []frontier.Range
	for off := int64(1); off < 40; off += 3 {
		done = append(done, frontier.Range{From: off, To: off + 1})
	}
	meta, bound, _ := frontier.EncodeTail(0, done, 16)
	tail, _ := frontier.DecodeTail(meta, 0)
	fmt.Println(meta, tail.Ranges, "bound", bound)
	// Output: sa1:bAAIBH0mSJEk [{1 2} {4 5} {7 8} {10 11} {13 14} {16 17} {19 20} {22 23} {25 26} {28 29} {31 32}] bound 34
}
