// Package pbtime sets protobuf's well-known time messages in place: the values
// timestamppb.New and durationpb.New return, written into messages that are part of a
// larger allocation (an audit step made together with its time and duration), so that
// building them costs no allocation of its own.
package pbtime

import (
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// SetTimestamp sets ts to t, as timestamppb.New(t) makes it.
func SetTimestamp(ts *timestamppb.Timestamp, t time.Time) {
	ts.Seconds, ts.Nanos = t.Unix(), int32(t.Nanosecond())
}

// SetDuration sets pd to d, as durationpb.New(d) makes it.
func SetDuration(pd *durationpb.Duration, d time.Duration) {
	nanos := d.Nanoseconds()
	secs := nanos / 1e9
	pd.Seconds, pd.Nanos = secs, int32(nanos-secs*1e9)
}
