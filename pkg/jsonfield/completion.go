package jsonfield

// Completion follows JSON text that arrives in pieces (a streamed tool call's arguments)
// and says whether the text so far is one complete object, array or string: Valid of the
// whole text, asked only where the text can have become complete. Asking Valid after
// every piece costs the text's length each time, so a long value in small pieces costs
// the square of its length; Completion reads each byte once to find where its outermost
// value ends, and calls Valid once there.
//
// A number or a literal (true, false, null) at the top is never complete: any piece may
// still add a digit to it, and tool arguments are objects in every provider's protocol.
// The zero value is ready for use.
type Completion struct {
	text    []byte
	state   completionState
	depth   int  // open objects and arrays, in a container
	inStr   bool // inside a string
	escaped bool // after a backslash in a string
}

type completionState uint8

const (
	before    completionState = iota // only white space so far
	container                        // inside the outermost object or array
	topString                        // inside a string at the top
	scalar                           // a number or literal at the top: never complete
	ended                            // the outermost value has ended, only white space since
	checked                          // ended, and Valid accepted the text
	dead                             // no continuation can be valid
)

// Write adds a piece of the text.
func (c *Completion) Write(piece string) {
	if c.state == dead || c.state == scalar {
		return // the text is no longer needed: the answer cannot change
	}
	c.text = append(c.text, piece...)
	for i := 0; i < len(piece); i++ {
		b := piece[i]
		if c.inStr {
			switch {
			case c.escaped:
				c.escaped = false
			case b == '\\':
				c.escaped = true
			case b == '"':
				c.inStr = false
				if c.state == topString {
					c.state = ended
				}
			}
			continue
		}
		switch c.state {
		case before:
			switch b {
			case ' ', '\t', '\n', '\r':
			case '{', '[':
				c.state, c.depth = container, 1
			case '"':
				c.state, c.inStr = topString, true
			default:
				c.state, c.text = scalar, nil
				return
			}
		case container:
			switch b {
			case '"':
				c.inStr = true
			case '{', '[':
				c.depth++
			case '}', ']':
				if c.depth--; c.depth == 0 {
					c.state = ended
				}
			}
		case ended, checked:
			switch b {
			case ' ', '\t', '\n', '\r':
			default:
				// Something after the outermost value: never valid, whatever follows.
				c.state, c.text = dead, nil
				return
			}
		}
	}
}

// Complete reports whether the text written so far is one complete JSON object, array or
// string, with nothing but white space around it.
func (c *Completion) Complete() bool {
	if c.state == ended {
		if Valid(c.text) {
			c.state = checked
		} else {
			// The outermost value ended and is not valid JSON: no continuation is.
			c.state, c.text = dead, nil
		}
	}
	return c.state == checked
}
