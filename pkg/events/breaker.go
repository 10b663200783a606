package events

import (
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/resilience"
)

// BreakerState is a breaker's state as events, metrics and DescribeRoutes carry it; the
// router's provider breakers and the agent's tool breakers both report with it.
func BreakerState(s resilience.State) mantlev1.BreakerState {
	switch s {
	case resilience.StateOpen:
		return mantlev1.BreakerState_BREAKER_STATE_OPEN
	case resilience.StateHalfOpen:
		return mantlev1.BreakerState_BREAKER_STATE_HALF_OPEN
	}
	return mantlev1.BreakerState_BREAKER_STATE_CLOSED
}
