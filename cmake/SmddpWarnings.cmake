# Warning flags for smddp's own targets (never forced on consumers).
add_library(smddp_warnings INTERFACE)
target_compile_options(smddp_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wno-unused-parameter>)
if(SMDDP_WERROR)
  target_compile_options(smddp_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>
                                                   $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>)
endif()
