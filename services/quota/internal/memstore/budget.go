package memstore

// budgetState is a tenant's spending on one day.
type budgetState struct {
	day   int64
	spent int64
}

// spentOn returns what was spent on day: nothing when the state is from an earlier day.
func (b budgetState) spentOn(day int64) int64 {
	if b.day != day {
		return 0
	}
	return b.spent
}
