package share

import "github.com/safeack/safeack/internal/delivery"

var _ delivery.Batchable = (*Delivery)(nil)

// Ending closes when the subscription stops handing out, as
// AssignmentEnded turns true.
func (d *Delivery) Ending() <-chan struct{} { return d.sub.stop.Done() }

// HandOutPool returns the subscription and its MaxInFlight handlers.
func (d *Delivery) HandOutPool() (any, int) { return d.sub, cap(d.sub.handlers) }
