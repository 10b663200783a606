package pbtime

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func TestSetAsNew(t *testing.T) {
	t.Parallel()
	for _, tt := range []time.Time{
		time.Unix(0, 0),
		time.Unix(1_764_806_400, 123_456_789),
		time.Unix(-1, 999_999_999), // before 1970: seconds negative, nanos positive
		time.Date(1969, 12, 31, 23, 59, 59, 1, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 999_999_999, time.FixedZone("x", 3600)),
	} {
		var got timestamppb.Timestamp
		SetTimestamp(&got, tt)
		if want := timestamppb.New(tt); !proto.Equal(&got, want) {
			t.Errorf("SetTimestamp(%v) = %v, want %v", tt, &got, want)
		}
	}
	for _, d := range []time.Duration{0, 1, -1, 999_999_999, -999_999_999, time.Second, -1500 * time.Millisecond,
		1<<63 - 1, -1 << 63} {
		var got durationpb.Duration
		SetDuration(&got, d)
		if want := durationpb.New(d); !proto.Equal(&got, want) {
			t.Errorf("SetDuration(%v) = %v, want %v", d, &got, want)
		}
	}
}
