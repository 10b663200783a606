package verifier

import (
	"errors"
	"fmt"
	"math"
)

// Config is the verifier block of mantle's YAML configuration:
//
//	verifier:
//	  confidence_threshold: 0.3
//	  refusal_phrases: ["I'm sorry, but I can't", "我无法", ...]
//	  repetition_threshold: 4
//	  max_content_bytes: 1048576
type Config struct {
	// ConfidenceThreshold fails a JSON answer whose top-level numeric "confidence" field is
	// strictly below it. The seed's example is 0.3.
	ConfidenceThreshold float64 `yaml:"confidence_threshold"`
	// RefusalPhrases replace the built-in list (DefaultRefusalPhrases) when set. Matching
	// ignores case, punctuation, whitespace and full/half width, so "抱歉，我不能" also
	// matches "抱歉, 我不能". Absent or null means the defaults; an explicit empty list
	// turns refusal detection off.
	RefusalPhrases []string `yaml:"refusal_phrases"`
	// RepetitionThreshold is how many times in a row the same sentence (or cycle of up to
	// three sentences) may appear before the answer counts as a decoding loop.
	RepetitionThreshold int `yaml:"repetition_threshold"`
	// MaxContentBytes bounds the answer a caller may send; larger answers are rejected as
	// INVALID_ARGUMENT rather than verified, so one request cannot pin a CPU.
	MaxContentBytes int `yaml:"max_content_bytes"`
}

// DefaultConfig returns the configuration used when the file says nothing.
func DefaultConfig() Config {
	return Config{
		ConfidenceThreshold: 0.3,
		RefusalPhrases:      DefaultRefusalPhrases(),
		RepetitionThreshold: 4,
		MaxContentBytes:     1 << 20,
	}
}

// Validate reports every invalid key, each message naming the key relative to this block.
func (c Config) Validate() error {
	var errs []error
	if math.IsNaN(c.ConfidenceThreshold) || c.ConfidenceThreshold < 0 || c.ConfidenceThreshold > 1 {
		errs = append(errs, fmt.Errorf("confidence_threshold: must be between 0 and 1, got %v", c.ConfidenceThreshold))
	}
	for i, phrase := range c.RefusalPhrases {
		if key, _ := appendMatchKey(nil, phrase, math.MaxInt); len(key) == 0 {
			errs = append(errs, fmt.Errorf("refusal_phrases[%d]: must contain a letter or digit, got %q", i, phrase))
		}
	}
	if c.RepetitionThreshold < 2 {
		errs = append(errs, fmt.Errorf("repetition_threshold: must be at least 2, got %d", c.RepetitionThreshold))
	}
	if c.MaxContentBytes <= 0 {
		errs = append(errs, fmt.Errorf("max_content_bytes: must be positive, got %d", c.MaxContentBytes))
	}
	return errors.Join(errs...)
}
