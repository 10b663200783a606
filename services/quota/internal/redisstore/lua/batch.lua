-- batch: run a list of operations in order, each with its own reply, in one call. One
-- call per batch instead of one script per operation saves, per operation, the call's
-- setup (the KEYS and ARGV tables, the script's helpers when run as EVAL), Redis TIME
-- and the reply's framing.
--
-- keys: every operation's keys, in order. args[1]: a MessagePack array (msgpack.go)
-- holding per operation its name (r reserve, s settle, a adjust, t retry), its number
-- of keys (1 or 2) and the array of its arguments, which are what the operation's file
-- documents as ARGV. cmsgpack decodes it in C, numbers as numbers, so that no argument
-- goes through a Redis object, a Lua string and tonumber.
--
-- Returns, packed with cmsgpack, one reply per operation: what the operation returns,
-- or {err = message} when it failed. A failed operation does not stop the others; like
-- a failed script, it keeps the writes it made before failing.
local ops = {r = op_reserve, s = op_settle, a = op_adjust, t = op_retry}

local function batch(keys, args)
  now_s, now_ns = nil, nil
  local ok, list = pcall(cmsgpack.unpack, args[1] or '')
  if not ok or type(list) ~= 'table' then
    return redis.error_reply('ERR quota batch: malformed operation list')
  end
  local out = {}
  local k = 1
  for i = 1, #list, 3 do
    local op, nk, argv = ops[list[i]], list[i + 1], list[i + 2]
    if not op or (nk ~= 1 and nk ~= 2) or type(argv) ~= 'table' or not keys[k + nk - 1] then
      return redis.error_reply('ERR quota batch: malformed operation at ' .. i)
    end
    local k2 = nil
    if nk == 2 then
      k2 = keys[k + 1]
    end
    local ok, res = pcall(op, keys[k], k2, argv)
    if type(res) == 'table' and res.err then
      -- An error reply, returned or raised: its message alone (Redis's own error tables
      -- carry other fields, which the client does not read).
      out[#out + 1] = {err = res.err}
    elseif ok then
      out[#out + 1] = res
    elseif type(res) == 'string' and string.find(res, '^%u+ ') then
      -- A Redis error (WRONGTYPE ..., OOM ...) raised by redis.call: as it was.
      out[#out + 1] = {err = res}
    else
      out[#out + 1] = {err = 'ERR quota: ' .. tostring(res)}
    end
    k = k + nk
  end
  -- One string for all the replies (msgpack.go): Redis sends it as it is, and the
  -- client reads it without a value per number.
  return cmsgpack.pack(out)
end
