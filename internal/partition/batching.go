package partition

import contract "github.com/safeack/safeack/internal/delivery"

var _ contract.Batchable = (*Record)(nil)

// Ending closes when the assignment that delivered the record starts
// ending, as AssignmentEnded turns true.
func (r *Record) Ending() <-chan struct{} { return r.owner.ctx.Done() }

// HandOutPool returns the subscription's pool and its MaxInFlight tokens.
func (r *Record) HandOutPool() (any, int) { return r.owner.pool, r.owner.pool.size }
