package x

import "time"

func g() { time.Sleep(7) }
