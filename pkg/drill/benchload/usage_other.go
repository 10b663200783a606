//go:build !unix

package benchload

// usage is not measured where getrusage does not exist; CPU and RSS read as zero.
func usage() rusage { return rusage{} }
